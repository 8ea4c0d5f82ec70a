"""The demo for a host without GPUs (`make up GPULAB_DEMO=1`): the hub finds the same
simulated GPUs the exporter's --fake-gpus reports, so leases, the spawn form and the
dashboard line up. Tried from outside with a real `make up GPULAB_DEMO=1` (the note of
the stop that built it); the exporter's --no-gpus is in test_exporter_http.py and the
alert that stays quiet in monitoring/prometheus/alerts_test.yml."""

from __future__ import annotations

from gpulab.contract import DEMO_GPUS, demo_gpu_uuid
from gpulab.gpus.discovery import discover_gpus
from gpulab_exporter.fake_nvml import fake_uuid


def test_the_hub_finds_the_exporters_simulated_gpus_in_the_demo(monkeypatch, caplog):
    monkeypatch.setenv("GPULAB_DEMO", "1")
    found = discover_gpus()
    assert [(g.index, g.uuid) for g in found] == [(i, fake_uuid(i)) for i in range(DEMO_GPUS)]
    assert all(g.model == "simulated GPU (demo)" for g in found)
    assert "DEMO: 2 simulated GPUs" in caplog.text


def test_outside_the_demo_nothing_is_simulated(monkeypatch):
    monkeypatch.delenv("GPULAB_DEMO", raising=False)
    assert all(not g.uuid.startswith("GPU-fa4e") for g in discover_gpus())
    monkeypatch.setenv("GPULAB_DEMO", "")
    assert all(not g.uuid.startswith("GPU-fa4e") for g in discover_gpus())


def test_the_demo_uuids_are_the_exporters():
    assert [demo_gpu_uuid(i) for i in range(4)] == [fake_uuid(i) for i in range(4)]
