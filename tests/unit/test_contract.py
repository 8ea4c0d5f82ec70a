"""The contract between gpulab's processes is spelled once (gpulab.contract); the exporter,
its own package that cannot import gpulab, keeps a copy that must match, and
docker-compose.yml's container names are the ones the contract reserves."""

import re
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


def test_the_metrics_the_hub_queries_are_the_ones_the_exporter_produces(produced):
    assert {contract.METRIC_UTILIZATION, contract.METRIC_MEMORY_USED,
            contract.METRIC_MEMORY_TOTAL, contract.METRIC_LEASE} <= produced


def test_every_metric_name_in_the_hubs_code_is_one_the_exporter_produces(produced):
    """A renamed metric must not leave a query behind that silently finds nothing."""
    mentioned = {}
    for path in sorted((REPO / "hub" / "gpulab").rglob("*.py")):
        for name in re.findall(r"\bgpulab_[a-z_]*[a-z]\b", path.read_text()):
            if name not in MODULES:
                mentioned.setdefault(name, path.relative_to(REPO))
    unknown = {n: str(p) for n, p in mentioned.items() if n not in produced}
    assert not unknown, f"not produced by the exporter: {unknown}"


# gpulab_* words in the hub's code that are not metrics: modules and packages.
MODULES = {"gpulab_exporter", "gpulab_gpus", "gpulab_channels", "gpulab_access"}
