"""The disruptive tests on a Docker engine and a stack of their own, beside the other lanes.

The disruptive lane restarts the hub, the proxy, dockerd and the whole stack, edits
gpulab.yaml and wipes volumes: on the main stack it must run alone, after the other
lanes. Here it gets its own: a dockerd in a network namespace of its own (own data root,
exec root, socket and PID file; --live-restore and the stand-in GPU hook, as
scripts/ensure-docker.sh starts the main one), the lab's images linked in from the main
engine's store (tests/swarm's image_store), a copy of this checkout (its own config/,
secrets/ and backups), and `make up` there. Its pytest then runs inside that namespace,
where 127.0.0.1:8000 is that stack's hub, with DOCKER_HOST at that engine: the tests run
unchanged, beside the other lanes.

    python -m tests.lane_engine run -- PYTEST ARGS     set up, run pytest there, tear down
    python -m tests.lane_engine up                     set up, and leave it running
    python -m tests.lane_engine prepare                a fresh machine: engine, images and
                                                       a copy of the checkout, no stack
    python -m tests.lane_engine make TARGET [VAR=V...] make there (restore, up, ...)
    python -m tests.lane_engine exec -- PYTEST ARGS    run pytest there (several may, at once)
    python -m tests.lane_engine down                   tear it down
    python -m tests.lane_engine start-dockerd          (for the tests' dockerd restarts)

`make test` runs every integration lane on such engines (scripts/test-integration.sh):
the gpus and members lanes share one (up, two execs, down), so that the suite never
touches the lab's own stack, config/, members' servers or leases on the main engine.

Everything it makes is under ROOT (/tmp/gpulab-lane) and the namespace gpulab-lane; a
run left behind by a killed one is taken down first. Processes are stopped by PID.
GPULAB_LANE_ENGINE names another such engine, beside it (/tmp/NAME, namespace NAME): a
second lane of disruptive tests (scripts/test-integration.sh).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME = os.environ.get("GPULAB_LANE_ENGINE", "gpulab-lane")
if not re.fullmatch(r"gpulab-lane[a-z0-9-]*", NAME):
    raise SystemExit(f"[lane-engine] GPULAB_LANE_ENGINE={NAME!r}: not gpulab-lane[a-z0-9-]*")
ROOT = Path("/tmp") / NAME
NETNS = NAME  # and the cgroup parent of its containers
DATA, EXEC, COPY = ROOT / "data", ROOT / "exec", ROOT / "repo"
SOCKET, PIDFILE, LOG = ROOT / "docker.sock", ROOT / "dockerd.pid", ROOT / "dockerd.log"
SYSTEM_CONTAINERD = Path("/run/containerd/containerd.sock")
IMAGES = ("gpulab/hub:latest", "gpulab/exporter:latest", "gpulab/prometheus:latest",
          "gpulab/singleuser:latest", "gpulab/base:bookworm")
# What the test stack's `make test` sets (Makefile TEST_STACK), for this stack too.
STACK_VARIABLES = ("GPULAB_EXPORTER_FLAGS", "GPULAB_SCRAPE_SECONDS")
# ... and what the tests read that is not about a stack: bench/suite_cpu's output file
# (without it, measuring this lane alone, as docs/testing.md says, wrote nothing)
TEST_VARIABLES = ("GPULAB_SUITE_CPU",)
# ... and which engine this is, for the tests' dockerd restarts (GPULAB_DOCKERD_START)
LANE_VARIABLES = ("GPULAB_LANE_ENGINE",)


def say(message: str) -> None:
    print(f"[lane-engine] {message}", file=sys.stderr, flush=True)


def in_netns(argv: list[str]) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{NETNS}", "--", *argv]


def environment() -> dict[str, str]:
    """The environment of everything run against this engine: none of the main stack's
    GPULAB_* (the outer `make test` exports its config folder, socket and backups)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GPULAB_") or k in STACK_VARIABLES + TEST_VARIABLES + LANE_VARIABLES}
    env.update(DOCKER_HOST=f"unix://{SOCKET}", GPULAB_DOCKER_SOCKET=str(SOCKET),
               # its containerd (scripts/lost-tasks.sh, tests/integration/test_lost_tasks.py),
               # never the main engine's
               GPULAB_CONTAINERD_SOCKET=str(EXEC / "containerd" / "containerd.sock"),
               GPULAB_BACKUP_DIR=str(COPY / ".test-backups"),
               GPULAB_MODELS_DIR=str(COPY / ".test-models"),
               GPULAB_DOCKERD_PIDFILE=str(PIDFILE),
               GPULAB_DOCKERD_START=f"{sys.executable} -m tests.lane_engine start-dockerd")
    env.pop("GPULAB_URL", None)
    return env


# ---------------------------------------------------------------- the engine

def dockerd_pid() -> int:
    """This engine's dockerd: the PID in its file, if that process is a dockerd started
    with this very PID file (a PID reused by another engine's dockerd is not it)."""
    try:
        pid = int(PIDFILE.read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return 0
    return pid if Path(argv[0].decode()).name == "dockerd" and str(PIDFILE).encode() in argv \
        else 0


def start_dockerd() -> None:
    """This engine's dockerd, as scripts/ensure-docker.sh starts the main one: with
    --live-restore and, on a host without a GPU, the stand-in GPU hook on its PATH."""
    if dockerd_pid():
        return
    path = os.environ.get("PATH", "")
    if not shutil.which("nvidia-smi") or subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True).returncode != 0:
        path = f"{REPO / 'tests' / 'gpu_standin'}:{path}"
    ROOT.joinpath("daemon.json").write_text("{}")
    argv = in_netns(["dockerd", "--config-file", str(ROOT / "daemon.json"),
                     "--host", f"unix://{SOCKET}", "--data-root", str(DATA),
                     "--exec-root", str(EXEC), "--pidfile", str(PIDFILE), "--live-restore",
                     "--cgroup-parent", NETNS])
    # started by a shell that exits at once, so that dockerd is nobody's child here: the
    # tests wait for a stopped dockerd's /proc entry to go, which a zombie would keep
    subprocess.run(["setsid", "sh", "-c", 'exec "$@" >>"$0" 2>&1 </dev/null &', str(LOG),
                    *argv], env={**os.environ, "PATH": path}, check=True)
    deadline = time.monotonic() + 60
    while subprocess.run(["docker", "-H", f"unix://{SOCKET}", "info"],
                         capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"[lane-engine] dockerd did not answer in 60 s:\n"
                             f"{LOG.read_text()[-3000:]}")
        time.sleep(0.3)
    # As scripts/ensure-docker.sh does for the main engine: a container whose process
    # exited while dockerd was down can be lost by it just after it starts
    # (scripts/lost-tasks.sh); look for a minute. Seen in CI without it: the Docker API
    # filter exited as dockerd restarted, stayed "Exited" while containerd ran it, and
    # every later spawn of the lane failed.
    subprocess.run(["setsid", "sh", "-c", 'exec "$@" >>"$0" 2>&1 </dev/null &',
                    str(ROOT / "lost-tasks.log"), str(REPO / "scripts" / "lost-tasks.sh"),
                    "--watch", "60"],
                   env={**os.environ, "DOCKER_HOST": f"unix://{SOCKET}",
                        "GPULAB_CONTAINERD_SOCKET": str(EXEC / "containerd" / "containerd.sock")},
                   check=True)


def stop_dockerd(timeout: float = 60) -> None:
    pid = dockerd_pid()
    if not pid:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)


def docker(*args: str, check: bool = True, timeout: float = 120) -> str:
    out = subprocess.run(["docker", "-H", f"unix://{SOCKET}", *args], capture_output=True,
                         text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise SystemExit(f"[lane-engine] docker {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def seed_images() -> None:
    """The lab's images in this engine's store, linked from the main engine's (seconds),
    as tests/swarm does for its machines."""
    from tests.swarm.harness import Swarm

    info = json.loads(subprocess.run(["docker", "info", "--format", "{{json .}}"],
                                     capture_output=True, text=True, check=True).stdout)
    tags = {image: subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image],
                                  capture_output=True, text=True, check=True).stdout.strip()
            for image in IMAGES}
    DATA.mkdir(mode=0o710, parents=True, exist_ok=True)
    Swarm._copy_images_from(Path(info["DockerRootDir"]), DATA, tags)


# ---------------------------------------------------------------- the lane

def checkout_files(repo: Path) -> bytes:
    """The files of the checkout at *repo* as git sees them (tracked and untracked, not
    ignored), NUL-separated. A lane's copy is no git checkout: there, its files but what
    .gitignore names (what its own `make up` made: secrets/, backups, ...)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=repo, capture_output=True)
    if listed.returncode == 0:
        return listed.stdout
    patterns = [ln.strip() for ln in (repo / ".gitignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]

    def ignored(rel: str, is_dir: bool) -> bool:
        for pattern in patterns:
            anchored, only_dirs = pattern.startswith("/"), pattern.endswith("/")
            glob = pattern.strip("/")
            if only_dirs and not is_dir:
                continue
            if fnmatch.fnmatch(rel, glob) if anchored else \
                    fnmatch.fnmatch(os.path.basename(rel), glob):
                return True
        return False

    found = []
    for folder, dirs, files in os.walk(repo):
        base = os.path.relpath(folder, repo)
        dirs[:] = [d for d in dirs if not ignored(os.path.normpath(os.path.join(base, d)), True)]
        found += [os.path.normpath(os.path.join(base, f)) for f in files
                  if not ignored(os.path.normpath(os.path.join(base, f)), False)]
    return b"".join(f.encode() + b"\0" for f in sorted(found))


def copy_checkout() -> None:
    """This checkout's files as git sees them (tracked and untracked, not ignored)."""
    COPY.mkdir(parents=True)
    files = checkout_files(REPO)
    subprocess.run(f"tar --null -T - -cf - | tar -C {COPY} -xf -", shell=True, cwd=REPO,
                   input=files, check=True)
    # config/ as the admin left it, not as a test of the main stack's lanes has it edited
    # right now (the tar above can catch an edit: a disruptive test that edits a file
    # then found it already so, and its edit was a no-op).
    for name, text in config_as_left(REPO / "config").items():
        if (COPY / "config" / name).is_file():
            (COPY / "config" / name).write_text(text)
    # The test identity provider's npm packages (make test-idp), ignored by git: the
    # lane's tests start it from the copy (tests/idp.py).
    node_modules = REPO / "tests" / "idp" / "node_modules"
    if node_modules.is_dir():
        (COPY / "tests" / "idp" / "node_modules").symlink_to(node_modules)


# LabConfig (tests/integration/stack.py) keeps each original beside the file it edits
# until it puts it back: `.NAME.before-tests.PID`.
BEFORE_TESTS = ".before-tests."


def config_as_left(directory: Path) -> dict[str, str]:
    """The files of *directory* by name, with the original in place of any file a test is
    editing. Read again until nothing in it changed while it was read: an edit and a
    put-back each write a backup or replace the file (a new inode), so a read that saw
    neither change saw one consistent state."""
    def state() -> dict[str, tuple[int, int, int]]:
        out = {}
        for entry in os.scandir(directory):
            with contextlib.suppress(FileNotFoundError):
                st = entry.stat(follow_symlinks=False)
                out[entry.name] = (st.st_ino, st.st_mtime_ns, st.st_size)
        return out

    for _ in range(1000):
        before = state()
        try:
            texts = {name: (directory / name).read_text() for name in before
                     if not name.startswith(".") and (directory / name).is_file()}
            # the oldest backup of a file is the admin's: a second test process that
            # edits it meanwhile backs up the first one's edit
            for name in sorted(before, key=lambda n: before[n][1], reverse=True):
                edited, sep, pid = name[1:].rpartition(BEFORE_TESTS)
                if name.startswith(".") and sep and pid.isdigit() and edited in texts:
                    texts[edited] = (directory / name).read_text()
        except FileNotFoundError:
            time.sleep(0.01)
            continue
        if state() == before:
            return texts
        time.sleep(0.01)
    raise SystemExit(f"[lane-engine] {directory} kept changing while it was read")


def make(target: str, *variables: str, timeout: float = 600) -> str:
    """``make TARGET VARIABLE=VALUE...`` in this engine's copy of the checkout, in its
    namespace; what it printed."""
    out = subprocess.run(in_netns(["make", "-C", str(COPY), "-s", "--no-print-directory",
                                   target, "BUILD_IMAGES=no", *variables]),
                         env=environment(), capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"[lane-engine] make {target} failed:\n{out.stdout[-3000:]}"
                         f"{out.stderr[-3000:]}")
    return out.stdout + out.stderr


def unmount_under(root: Path) -> None:
    from tests.swarm.plan import mounts_under

    for point in mounts_under(Path("/proc/mounts").read_text(), str(root)):
        subprocess.run(["umount", "-l", point], capture_output=True)


def teardown() -> None:
    """Everything a run made, whether it ended or was killed."""
    if ROOT.exists():
        if dockerd_pid():
            if COPY.exists():
                subprocess.run(in_netns(["make", "-C", str(COPY), "-s", "down"]),
                               env=environment(), capture_output=True, timeout=300)
            ids = docker("ps", "-aq", check=False).split()
            if ids:
                docker("rm", "-f", *ids, check=False, timeout=300)
            stop_dockerd()
        unmount_under(ROOT)
        shutil.rmtree(ROOT, ignore_errors=True)
    subprocess.run(["ip", "netns", "delete", NETNS], capture_output=True)


def prepare() -> None:
    """A fresh machine: the engine with the lab's images, and a copy of the checkout
    (no secrets/, no volume, no stack)."""
    if SYSTEM_CONTAINERD.exists():
        # dockerd would share it (and its "moby" namespace) with the main engine
        raise SystemExit(f"[lane-engine] {SYSTEM_CONTAINERD} exists: a dockerd of its own "
                         f"would use that containerd. Run with GPULAB_LANES=main.")
    teardown()
    ROOT.mkdir(mode=0o711)
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    subprocess.run(["ip", "-n", NETNS, "link", "set", "lo", "up"], check=True)
    started = time.monotonic()
    seed_images()
    start_dockerd()
    copy_checkout()
    say(f"engine up in {time.monotonic() - started:.0f} s (namespace {NETNS}, {ROOT})")


def setup() -> None:
    started = time.monotonic()
    prepare()
    make("up")
    say(f"engine and stack up in {time.monotonic() - started:.0f} s "
        f"(namespace {NETNS}, {ROOT})")


def run_pytest(pytest_args: list[str]) -> int:
    """pytest with *pytest_args*, in this engine's namespace and copy of the checkout."""
    if not (COPY.exists() and dockerd_pid()):
        raise SystemExit(f"[lane-engine] {NAME} is not up: python -m tests.lane_engine up")
    pytest = REPO / ".venv" / "bin" / "pytest"
    return subprocess.run(in_netns([str(pytest), *pytest_args]), cwd=COPY,
                          env=environment()).returncode


def run(pytest_args: list[str]) -> int:
    try:
        setup()
        return run_pytest(pytest_args)
    finally:
        teardown()


def main(argv: list[str]) -> int:
    args = argv[2:] if argv[1:2] == ["--"] else argv[1:]
    if argv[:1] == ["run"]:
        return run(args)
    if argv[:1] == ["exec"]:
        return run_pytest(args)
    if argv == ["up"]:
        setup()
        return 0
    if argv == ["prepare"]:
        prepare()
        return 0
    if argv[:1] == ["make"] and len(argv) >= 2:
        print(make(argv[1], *argv[2:]), end="")
        return 0
    if argv == ["down"]:
        teardown()
        return 0
    if argv == ["start-dockerd"]:
        start_dockerd()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
