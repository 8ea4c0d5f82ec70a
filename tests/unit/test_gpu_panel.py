"""The GPU panel's snapshot (images/singleuser/gpulab_gpus.py) against a stand-in NVML:
the GPU itself is the one edge these tests cannot reach. A real server's panel is
driven in Chromium by tests/integration/test_member_tools.py."""

from __future__ import annotations

import importlib.util
import json
import threading
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpulab.settings import defaults
from gpulab.spawn.containers import container_options

PANEL = Path(__file__).resolve().parents[2] / "images" / "singleuser" / "gpulab_gpus.py"
spec = importlib.util.spec_from_file_location("gpulab_gpus", PANEL)
gpulab_gpus = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpulab_gpus)

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"


def spawned(*uuids: str, cdi: bool = False) -> dict[str, str]:
    """The environment gpulab's spawner gives a server with these GPUs (the spawner's own
    code), and with ``cdi`` as it reads inside the container when the NVIDIA toolkit runs
    in CDI mode: the CDI spec's edits set NVIDIA_VISIBLE_DEVICES=void, GPUs or not."""
    env = dict(container_options(defaults(), "ann", gpu_uuids=uuids).environment)
    if cdi:
        env["NVIDIA_VISIBLE_DEVICES"] = "void"
    return env


class NVMLError(Exception):
    """pynvml's errors are Exception subclasses whose str() is NVML's message."""


class StandInNVML:
    """The few pynvml calls the panel makes, answering from a list of GPUs; a value
    that is an exception instance is raised, as NVML raises NotSupported and friends."""

    def __init__(self, gpus: list[dict] | None = None, init_error: Exception | None = None):
        self.gpus = gpus or []
        self.init_error = init_error
        self.shutdowns = 0

    def _get(self, handle, key):
        value = self.gpus[handle][key]
        if isinstance(value, Exception):
            raise value
        return value

    def nvmlInit(self):  # noqa: N802 (pynvml's names)
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):  # noqa: N802
        return index

    def nvmlDeviceGetName(self, handle):  # noqa: N802
        return self._get(handle, "name")

    def nvmlDeviceGetUUID(self, handle):  # noqa: N802
        return self._get(handle, "uuid")

    def nvmlDeviceGetMemoryInfo(self, handle):  # noqa: N802
        used, total = self._get(handle, "memory")
        return SimpleNamespace(used=used, total=total, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle):  # noqa: N802
        return SimpleNamespace(gpu=self._get(handle, "util"), memory=0)


@pytest.mark.parametrize("uuids", [(), (UUID0,), (UUID0, UUID1)])
@pytest.mark.parametrize("cdi", [False, True], ids=["runtime", "cdi"])
def test_assigned_devices_are_the_spawners_gpulab_gpus(uuids, cdi):
    """GPULAB_GPUS, whatever NVIDIA_VISIBLE_DEVICES reads (void under CDI)."""
    assert gpulab_gpus.assigned_devices(spawned(*uuids, cdi=cdi)) == list(uuids)


@pytest.mark.parametrize("env, devices", [
    ({"GPULAB_GPUS": f" {UUID0} , "}, [UUID0]),
    ({"GPULAB_GPUS": "", "NVIDIA_VISIBLE_DEVICES": "all"}, []),  # the hub's word counts
    ({"GPULAB_GPUS": UUID0, "NVIDIA_VISIBLE_DEVICES": "void"}, [UUID0]),
])
def test_gpulab_gpus_wins_over_nvidia_visible_devices(env, devices):
    assert gpulab_gpus.assigned_devices(env) == devices


@pytest.mark.parametrize("value, devices", [
    (None, []), ("", []), ("void", []), ("none", []), ("NONE", []),
    (UUID0, [UUID0]), (f"{UUID0},{UUID1}", [UUID0, UUID1]), (f" {UUID0} , ", [UUID0]),
    ("0,1", ["0", "1"]), ("all", ["all"]),
])
def test_without_gpulab_gpus_nvidia_visible_devices_is_read(value, devices):
    """The image run without gpulab's spawner (no GPULAB_GPUS at all)."""
    env = {} if value is None else {"NVIDIA_VISIBLE_DEVICES": value}
    assert gpulab_gpus.assigned_devices(env) == devices


def test_two_gpus_with_memory_and_utilization():
    nvml = StandInNVML([
        {"name": b"NVIDIA H200", "uuid": UUID0, "memory": (2 * 2**30, 141 * 2**30), "util": 37},
        {"name": "NVIDIA H200", "uuid": UUID1.encode(), "memory": (0, 141 * 2**30), "util": 0},
    ])
    snap = gpulab_gpus.snapshot(nvml, spawned(UUID0, UUID1))
    assert snap == {"message": None, "assigned": [UUID0, UUID1], "gpus": [
        {"index": 0, "mig": False, "name": "NVIDIA H200", "uuid": UUID0,
         "memory_used_bytes": 2 * 2**30,
         "memory_total_bytes": 141 * 2**30, "utilization_percent": 37},
        {"index": 1, "mig": False, "name": "NVIDIA H200", "uuid": UUID1,
         "memory_used_bytes": 0,
         "memory_total_bytes": 141 * 2**30, "utilization_percent": 0},
    ]}
    assert nvml.shutdowns == 1


def test_a_server_given_a_mig_device_shows_it_not_its_gpu():
    """Through the real pynvml on the exporter's FakeLibNvml (a stand-in for libnvidia-ml):
    GPU 0 in MIG mode, both its devices visible to NVML here; the panel shows the one the
    hub assigned, with no utilization (none under MIG)."""
    import pynvml

    from gpulab_exporter.fake_nvml import FakeGpu, FakeLibNvml, mig_uuid, split_mig

    gpu = FakeGpu(0)
    split_mig(gpu, 2)
    with FakeLibNvml([gpu]).installed():
        snap = gpulab_gpus.snapshot(pynvml, spawned(mig_uuid(0, 1)))
    assert snap["message"] is None and snap["assigned"] == [mig_uuid(0, 1)]
    assert [(g["index"], g["mig"], g["uuid"], g["utilization_percent"])
            for g in snap["gpus"]] == [("0:1", True, mig_uuid(0, 1), None)]
    assert snap["gpus"][0]["memory_total_bytes"] == gpu.instances[1].memory_total


def test_a_value_nvml_does_not_give_is_none_and_the_rest_stays():
    """MIG instances, for one, have no utilization: that field is None, not an error."""
    nvml = StandInNVML([{"name": "NVIDIA A100 MIG 1g.10gb", "uuid": UUID0,
                         "memory": NVMLError("Not Supported"), "util": NVMLError("Not Supported")}])
    gpu, = gpulab_gpus.snapshot(nvml, spawned(UUID0))["gpus"]
    assert gpu == {"index": 0, "mig": False, "name": "NVIDIA A100 MIG 1g.10gb", "uuid": UUID0,
                   "memory_used_bytes": None, "memory_total_bytes": None,
                   "utilization_percent": None}


@pytest.mark.parametrize("env", [{}, {"NVIDIA_VISIBLE_DEVICES": "void"}, spawned(),
                                 spawned(cdi=True)])
def test_no_gpu_assigned_says_so_and_how_to_get_one(env):
    nvml = StandInNVML(init_error=NVMLError("NVML Shared Library Not Found"))
    snap = gpulab_gpus.snapshot(nvml, env)
    assert snap["gpus"] == [] and snap["assigned"] == []
    assert snap["message"].startswith("No GPU assigned to this server.")
    assert "Hub Control Panel" in snap["message"]


def test_an_assigned_gpu_that_nvml_cannot_reach_is_named_with_the_reason():
    """The test stack's stand-in GPUs: the hub gave a UUID, but no driver is injected."""
    nvml = StandInNVML(init_error=NVMLError("NVML Shared Library Not Found"))
    snap = gpulab_gpus.snapshot(nvml, spawned(UUID0))
    assert snap["gpus"] == [] and snap["assigned"] == [UUID0]
    assert snap["message"] == (
        f"No GPU is reachable from this server, although the hub assigned it {UUID0}: the "
        f"NVIDIA driver could not be used inside the container (NVML: NVML Shared Library "
        f"Not Found). Please tell the lab's admins.")


def test_nvml_that_sees_no_device_counts_as_none():
    snap = gpulab_gpus.snapshot(StandInNVML([]), spawned())
    assert snap["message"].startswith("No GPU assigned") and snap["gpus"] == []


def test_under_cdi_an_unreachable_gpu_is_not_called_unassigned():
    """CDI mode: NVIDIA_VISIBLE_DEVICES=void in a server the hub gave a GPU. If NVML then
    fails, the member is told the GPU is unreachable (tell the admins), not that she has
    none and should restart with one."""
    nvml = StandInNVML(init_error=NVMLError("Driver Not Loaded"))
    snap = gpulab_gpus.snapshot(nvml, spawned(UUID0, cdi=True))
    assert snap["assigned"] == [UUID0]
    assert snap["message"].startswith(f"No GPU is reachable from this server, although the "
                                      f"hub assigned it {UUID0}")


def test_under_cdi_the_gpus_nvml_sees_are_the_assigned_ones():
    nvml = StandInNVML([{"name": "NVIDIA H200", "uuid": UUID0, "memory": (0, 141 * 2**30),
                         "util": 0}])
    snap = gpulab_gpus.snapshot(nvml, spawned(UUID0, cdi=True))
    assert snap["message"] is None and snap["assigned"] == [UUID0]
    assert [g["uuid"] for g in snap["gpus"]] == [UUID0]


def test_a_device_error_mid_read_is_a_message_not_a_traceback():
    class Lost(StandInNVML):
        def nvmlDeviceGetHandleByIndex(self, index):  # noqa: N802
            raise NVMLError("GPU is lost")

    snap = gpulab_gpus.snapshot(Lost([{}]), spawned(UUID0))
    assert snap["gpus"] == [] and "GPU is lost" in snap["message"]


def test_the_server_serves_the_page_and_the_snapshot(monkeypatch):
    monkeypatch.setattr(gpulab_gpus, "snapshot", lambda: {"gpus": [], "assigned": [],
                                                          "message": "No GPU assigned"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), gpulab_gpus.Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(f"{base}/", timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/html")
            page = r.read().decode()
        assert 'fetch("gpus.json"' in page  # relative: works under any proxy prefix
        with urllib.request.urlopen(f"{base}/gpus.json?t=1", timeout=10) as r:
            assert json.load(r)["message"] == "No GPU assigned"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}/other", timeout=10)
        assert e.value.code == 404
    finally:
        server.shutdown()
        server.server_close()
