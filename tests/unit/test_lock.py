"""Every image's Python packages locked with hashes: scripts/lock.py
(`make lock`) and scripts/wheelhouse.sh with a real pip, against a folder of small wheels
this test makes (no registry, and none of this machine's pip configuration:
PIP_CONFIG_FILE=/dev/null), and the locks in the repository against their requirements.

What the Dockerfiles do with a lock (`pip install --require-hashes --no-index
--find-links WHEELS -r LOCK`) is tried here with the same pip, as a dry run."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.wheels import write_wheel

ROOT = Path(__file__).resolve().parents[2]
LOCK_PY = ROOT / "scripts" / "lock.py"
PIP_ENV = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
LOCK_LINE = re.compile(r"^([a-z0-9-]+)===(\S+) \\\n    --hash=sha256:([0-9a-f]{64})$", re.M)


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=PIP_ENV, capture_output=True, text=True, timeout=120)


@pytest.fixture
def index(tmp_path) -> Path:
    """app 1.0 requiring lib; lib 1.0 and 1.1; and a local build lib 1.0+site, which pip
    takes for `lib==1.0` (a local version meets a public pin, and sorts higher)."""
    folder = tmp_path / "index"
    folder.mkdir()
    write_wheel(folder, "gpulabdemo-app", "1.0", requires=("gpulabdemo-lib>=1.0",))
    for version in ("1.0", "1.1", "1.0+site"):
        write_wheel(folder, "gpulabdemo-lib", version)
    return folder


def lock(tmp_path, index, *pins: str) -> subprocess.CompletedProcess:
    req = tmp_path / "requirements.txt"
    req.write_text("# top level\n" + "".join(f"{p}\n" for p in pins))
    return run(sys.executable, str(LOCK_PY), str(tmp_path / "requirements.lock"), str(req),
               "--", "--no-index", "--find-links", str(index))


def entries(path: Path) -> dict[str, tuple[str, str]]:
    return {m.group(1): (m.group(2), m.group(3)) for m in LOCK_LINE.finditer(path.read_text())}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_lock_lists_dependencies_with_their_wheels_hashes(tmp_path, index):
    done = lock(tmp_path, index, "gpulabdemo-app==1.0", "gpulabdemo-lib===1.1")
    assert done.returncode == 0, done.stderr
    assert "2 packages (written)" in done.stdout
    got = entries(tmp_path / "requirements.lock")
    assert got == {
        "gpulabdemo-app": ("1.0", sha256(index / "gpulabdemo_app-1.0-py3-none-any.whl")),
        "gpulabdemo-lib": ("1.1", sha256(index / "gpulabdemo_lib-1.1-py3-none-any.whl")),
    }
    # the same inputs give the same lock, byte for byte
    assert "(unchanged)" in lock(tmp_path, index, "gpulabdemo-app==1.0",
                                 "gpulabdemo-lib===1.1").stdout


def test_a_local_build_meeting_a_public_pin_is_refused_by_name(tmp_path, index):
    done = lock(tmp_path, index, "gpulabdemo-app==1.0", "gpulabdemo-lib==1.0")
    assert done.returncode != 0
    assert ("pin gpulabdemo-lib 1.0, but pip resolved 1.0+site" in done.stderr
            and "gpulabdemo-lib===1.0" in done.stderr), done.stderr
    assert not (tmp_path / "requirements.lock").exists()
    # and === takes the public one
    assert lock(tmp_path, index, "gpulabdemo-app==1.0", "gpulabdemo-lib===1.0").returncode == 0
    assert entries(tmp_path / "requirements.lock")["gpulabdemo-lib"][0] == "1.0"


def wheelhouse(tmp_path, index) -> subprocess.CompletedProcess:
    return run("bash", str(ROOT / "scripts" / "wheelhouse.sh"), str(tmp_path / "wheels"),
               str(tmp_path / "requirements.lock"), str(tmp_path / "requirements.txt"),
               "--", "--no-index", "--find-links", str(index))


def test_the_wheelhouse_takes_exactly_the_locked_wheels_and_refuses_any_other(tmp_path, index):
    assert lock(tmp_path, index, "gpulabdemo-app==1.0", "gpulabdemo-lib===1.1").returncode == 0
    done = wheelhouse(tmp_path, index)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "wheels").glob("*.whl")) == [
        "gpulabdemo_app-1.0-py3-none-any.whl", "gpulabdemo_lib-1.1-py3-none-any.whl"]
    assert "up to date" in wheelhouse(tmp_path, index).stdout

    # the index now serves another lib 1.1 (rebuilt, or tampered with): refused by hash
    write_wheel(index, "gpulabdemo-lib", "1.1", files={"gpulabdemo_lib/__init__.py": "X = 1\n"})
    (tmp_path / "wheels" / ".stamp").unlink()
    done = wheelhouse(tmp_path, index)
    assert done.returncode != 0
    assert "DO NOT MATCH THE HASHES" in done.stderr, done.stderr
    assert not (tmp_path / "wheels" / ".stamp").exists()  # the next run downloads again


def test_a_lock_older_than_its_requirements_is_refused_before_any_download(tmp_path, index):
    assert lock(tmp_path, index, "gpulabdemo-app==1.0", "gpulabdemo-lib===1.1").returncode == 0
    with open(tmp_path / "requirements.txt", "a") as req:
        req.write("gpulabdemo-other==2.0\n")
    done = wheelhouse(tmp_path, index)
    assert done.returncode != 0
    assert "changed since" in done.stderr and "make lock" in done.stderr, done.stderr
    assert not (tmp_path / "wheels").exists()


def test_the_images_install_refuses_a_package_the_lock_does_not_list(tmp_path, index):
    """The Dockerfiles' install, as a dry run: the full lock installs; a lock without the
    dependency (or a requirement without a hash) does not."""
    assert lock(tmp_path, index, "gpulabdemo-app==1.0", "gpulabdemo-lib===1.1").returncode == 0
    full = (tmp_path / "requirements.lock").read_text()

    def install(text: str) -> subprocess.CompletedProcess:
        (tmp_path / "try.lock").write_text(text)
        return run(sys.executable, "-m", "pip", "install", "--dry-run", "--require-hashes",
                   "--no-index", "--find-links", str(index), "--target", str(tmp_path / "t"),
                   "-r", str(tmp_path / "try.lock"))

    assert install(full).returncode == 0
    without_lib = re.sub(r"^gpulabdemo-lib===.*\n.*\n", "", full, flags=re.M)
    done = install(without_lib)
    assert done.returncode != 0 and "gpulabdemo-lib" in done.stderr, done.stderr
    assert "hash" in done.stderr.lower(), done.stderr


# -- the locks in the repository ---------------------------------------------------------
LOCKS = {  # lock -> the requirements it is made from (the Makefile's LOCKS)
    "images/hub/requirements.lock": ["images/hub/requirements.txt"],
    "images/singleuser/requirements-cpu.lock": ["images/singleuser/requirements.txt",
                                                "images/singleuser/requirements-cpu.txt"],
    "images/singleuser/requirements-cuda.lock": ["images/singleuser/requirements.txt",
                                                 "images/singleuser/requirements-cuda.txt"],
    "monitoring/exporter/requirements.lock": ["monitoring/exporter/requirements.txt"],
}


def test_the_makefile_locks_what_this_test_checks():
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    (line,) = [x for x in makefile.splitlines() if x.startswith("LOCKS =")]
    assert {lock: reqs.split(",") for lock, reqs in
            (item.split(":") for item in line.split("=", 1)[1].split())} == LOCKS


@pytest.mark.parametrize("lock_file", LOCKS)
def test_each_lock_is_current_and_holds_every_top_level_pin(lock_file):
    sys.path.insert(0, str(LOCK_PY.parent))
    try:
        import lock as lockpy
    finally:
        sys.path.remove(str(LOCK_PY.parent))
    reqs = [ROOT / r for r in LOCKS[lock_file]]
    assert lockpy.stale(ROOT / lock_file, reqs) is None
    got = entries(ROOT / lock_file)
    for name, version in lockpy.top_level_pins(reqs).items():
        assert got.get(name, (None,))[0] == version, (lock_file, name, version)


def test_the_variants_locks_hold_the_variants_torch():
    cpu = entries(ROOT / "images/singleuser/requirements-cpu.lock")
    cuda = entries(ROOT / "images/singleuser/requirements-cuda.lock")
    assert cpu["torch"][0].endswith("+cpu")
    assert "+" not in cuda["torch"][0]
    assert not any(n.startswith("nvidia-") and n != "nvidia-ml-py" for n in cpu)
    assert {"nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cublas"} <= set(cuda)
