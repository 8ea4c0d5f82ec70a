"""The contract between gpulab's processes is spelled once (gpulab.contract); the exporter,
its own package that cannot import gpulab, keeps a copy that must match, and
docker-compose.yml's container names are the ones the contract reserves."""

from pathlib import Path

import yaml

from gpulab import contract
from gpulab_exporter import attribution

REPO = Path(__file__).resolve().parents[2]


def test_exporter_reads_the_labels_the_hub_writes():
    assert attribution.LABEL_USER == contract.LABEL_USER
    assert attribution.LABEL_SERVER == contract.LABEL_SERVER
    assert attribution.LABEL_GPUS == contract.LABEL_GPUS


def test_compose_runs_exactly_the_reserved_infrastructure_containers():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    names = {s["container_name"] for s in compose["services"].values()}
    assert names == set(contract.INFRA_CONTAINERS)
    volumes = {v["name"] for v in compose["volumes"].values()}
    assert volumes <= set(contract.INFRA_VOLUMES)
    assert not any(n.startswith(contract.USER_CONTAINER_PREFIX) for n in names)
