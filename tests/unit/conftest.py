"""Fixtures shared by the unit tests: JupyterHub's real ORM on in-memory sqlite, and the
metric names the exporter really produces."""

from __future__ import annotations

import os

import pytest

# The unit tests test a lab's values: Prometheus' default 15 s scrape interval, whatever
# the shell has (make test gives the test stack 2 s). gpulab's modules read it at import.
os.environ.pop("GPULAB_SCRAPE_SECONDS", None)

from gpulab_exporter.attribution import Container, StaticContainerDirectory
from gpulab_exporter.collector import build_families
from gpulab_exporter.fake_nvml import FakeGpu, FakeNvml, fake_uuid, split_mig
from gpulab_exporter.nvml import GpuProcess
from gpulab_exporter.snapshot import Poller
from tests.unit.hub_orm import add_user, new_hub_db

CID = "d" * 64


@pytest.fixture
def db():
    session = new_hub_db()
    yield session
    session.close()


@pytest.fixture
def alice(db):
    return add_user(db, "alice")


@pytest.fixture(scope="module")
def produced(tmp_path_factory):
    """Every sample name the collector emits when all features are in use."""
    proc = tmp_path_factory.mktemp("proc")
    (proc / "7").mkdir()
    (proc / "7" / "cgroup").write_text(f"0::/docker/{CID}\n")
    nvml = FakeNvml([FakeGpu(0, processes=[GpuProcess(7, 1 << 20)]), FakeGpu(1)])
    split_mig(nvml.gpus[1], 2)  # MIG devices' families too
    directory = StaticContainerDirectory([Container(CID, "gpulab-ann", "ann", "", (fake_uuid(0),))])
    poller = Poller(nvml, directory=directory, proc=str(proc))
    poller.poll()
    names = {s.name for fam in build_families(poller.latest, process_info=True) for s in fam.samples}
    assert {"gpulab_gpu_lease_info", "gpulab_gpu_energy_joules_total",
            "gpulab_gpu_mig_device_info"} <= names
    return names
