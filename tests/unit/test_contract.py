"""The contract between gpulab's processes is spelled once (gpulab.contract); the exporter,
its own package that cannot import gpulab, keeps a copy that must match, and
docker-compose.yml's container names are the ones the contract reserves."""

import ipaddress
import re
from pathlib import Path

import pytest
import yaml

from gpulab import contract
from gpulab_exporter import attribution

REPO = Path(__file__).resolve().parents[2]


def test_exporter_reads_the_labels_the_hub_writes():
    assert attribution.LABEL_USER == contract.LABEL_USER
    assert attribution.LABEL_SERVER == contract.LABEL_SERVER
    assert attribution.LABEL_GPUS == contract.LABEL_GPUS
    assert attribution.LABEL_JOB == contract.LABEL_JOB


def test_compose_runs_exactly_the_reserved_infrastructure_containers():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    names = {s["container_name"] for s in compose["services"].values()}
    assert names == set(contract.INFRA_CONTAINERS)
    volumes = {v["name"] for v in compose["volumes"].values()}
    assert volumes <= set(contract.INFRA_VOLUMES)
    assert not any(n.startswith(contract.USER_CONTAINER_PREFIX) for n in names)


def test_every_container_of_the_stack_keeps_a_bounded_log_like_members_servers():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        assert service.get("logging") == {"driver": contract.LOG_DRIVER,
                                          "options": contract.log_options()}, name


def test_the_assistants_container_names_its_gpus_holder_as_the_lease_table_does():
    """The exporter attributes the assistant's GPUs to the holder the hub's lease table
    and spawn form name (gpulab.assistant.gpus), through the container's labels."""
    from gpulab.assistant.gpus import ASSISTANT, ASSISTANT_SERVER

    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    labels = compose["services"]["assistant"]["labels"]
    assert labels[contract.LABEL_USER] == ASSISTANT
    assert labels[contract.LABEL_SERVER] == ASSISTANT_SERVER
    assert labels[contract.LABEL_GPUS] == "${GPULAB_ASSISTANT_GPUS:-}"
    assert contract.LABEL_MANAGED not in labels  # not a lease the hub reads or may remove
    gpu = yaml.safe_load((REPO / "docker-compose.assistant-gpu.yml").read_text())
    [device] = gpu["services"]["assistant"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["device_ids"] == ["${GPULAB_ASSISTANT_GPUS:?set by make up from assistant.gpus}"]


def test_the_metrics_the_hub_queries_are_the_ones_the_exporter_produces(produced):
    assert {contract.METRIC_UTILIZATION, contract.METRIC_MEMORY_USED,
            contract.METRIC_MEMORY_TOTAL, contract.METRIC_LEASE,
            contract.METRIC_USER_MEMORY} <= produced


def produced_by_the_hub() -> set[str]:
    """The families the hub itself adds to its /hub/metrics (gpulab.line.metrics,
    gpulab.login.sso's checks, gpulab.assistant.gateway's requests), and gpulab-backup's (the same package, its own process)."""
    from gpulab.assistant.gateway import REQUESTS as ASSISTANT_REQUESTS
    from gpulab.backup.metrics import families as backup_families
    from gpulab.gpus.config import parse_gpus_config
    from gpulab.line.metrics import budget_families, families
    from gpulab.line.order import Entry
    from gpulab.line.usage import Usage

    every_figure = {"last_success": 1.0, "last_attempt_ok": True, "last_duration": 1.0,
                    "processed_bytes": 1, "added_bytes": 1, "repository_bytes": 1,
                    "snapshots": 1}
    from gpulab.login.sso import PROVIDER_CHECKS

    return ({f.name for f in families([Entry(1, "ann", "", 1, 0.0)], parse_gpus_config(""), 1.0)}
            | {f.name for f in backup_families(every_figure, 1.0, 1.0, {"backup": (2, 1)})}
            | {f.name for f in budget_families(parse_gpus_config(""), Usage())}
            # a counter: the family is named without _total, its samples with it
            | {name for f in PROVIDER_CHECKS.collect()
               for name in (f.name, *(sample.name for sample in f.samples))}
            # a counter with no sample before a member's first request
            | {name for f in ASSISTANT_REQUESTS.collect() for name in (f.name, f"{f.name}_total")})


def test_every_metric_name_in_the_hubs_code_is_one_the_exporter_or_the_hub_produces(produced):
    """A renamed metric must not leave a query behind that silently finds nothing."""
    mentioned = {}
    for path in sorted((REPO / "hub" / "gpulab").rglob("*.py")):
        for name in re.findall(r"\bgpulab_[a-z_]*[a-z]\b", path.read_text()):
            if name not in MODULES:
                mentioned.setdefault(name, path.relative_to(REPO))
    known = produced | produced_by_the_hub()
    unknown = {n: str(p) for n, p in mentioned.items() if n not in known}
    assert not unknown, f"produced neither by the exporter nor by the hub: {unknown}"


# gpulab_* words in the hub's code that are not metrics: modules and packages.
MODULES = {"gpulab_exporter", "gpulab_gpus", "gpulab_channels", "gpulab_access", "gpulab_work",
           "gpulab_job"}


# The addresses' variables, and the contract's value for each.
ADDRESSES = {"GPULAB_SUBNET": contract.USERS_SUBNET, "GPULAB_IP_RANGE": contract.USERS_IP_RANGE,
             "GPULAB_HUB_IP": contract.HUB_IP, "GPULAB_PROXY_IP": contract.PROXY_IP}


def test_compose_files_and_preflight_default_to_the_contracts_addresses():
    """${GPULAB_HUB_IP:-172.30.0.250} and the like, wherever compose or the shell spell a
    default: each one is the contract's."""
    found = {}
    for name in ("docker-compose.yml", "docker-compose.swarm.yml", "docker-compose.node.yml",
                 "docker-compose.https.yml", "docker-compose.gpu.yml", "scripts/preflight.sh"):
        for var, value in re.findall(r"\$\{(GPULAB_[A-Z_]+):-([^}]*)\}", (REPO / name).read_text()):
            if var in ADDRESSES:
                found.setdefault(var, set()).add(value)
    assert found == {var: {value} for var, value in ADDRESSES.items()}


def test_the_makefiles_defaults_are_the_contracts_addresses():
    makefile = (REPO / "Makefile").read_text()
    defaults = dict(re.findall(r"^export (GPULAB_[A-Z_]+) \?= (.*)$", makefile, re.M))
    # GPULAB_IP_RANGE ?= $(or $(GPULAB_SWARM_IP_RANGE),<default>)
    defaults["GPULAB_IP_RANGE"] = re.fullmatch(r"\$\(or \$\(\w+\),(.*)\)",
                                               defaults["GPULAB_IP_RANGE"]).group(1)
    assert {var: defaults[var] for var in ADDRESSES} == ADDRESSES


def test_the_hub_and_the_proxy_sit_in_the_subnet_above_the_servers_range():
    subnet = ipaddress.ip_network(contract.USERS_SUBNET)
    servers = ipaddress.ip_network(contract.USERS_IP_RANGE)
    assert servers.subnet_of(subnet)
    for address in (contract.HUB_IP, contract.PROXY_IP):
        assert ipaddress.ip_address(address) in subnet
        assert ipaddress.ip_address(address) not in servers


@pytest.mark.parametrize("environ, seconds", [({}, 15), ({"GPULAB_SCRAPE_SECONDS": "2"}, 2),
                                              ({"GPULAB_SCRAPE_SECONDS": " 30 "}, 30)])
def test_the_scrape_interval_is_read_from_the_environment(environ, seconds):
    assert contract.scrape_seconds(environ) == seconds


@pytest.mark.parametrize("raw", ["0", "2s", "-1", "301", "1.5"])
def test_a_scrape_interval_that_is_no_whole_number_of_seconds_is_refused(raw):
    with pytest.raises(ValueError, match="GPULAB_SCRAPE_SECONDS must be whole seconds"):
        contract.scrape_seconds({"GPULAB_SCRAPE_SECONDS": raw})


def test_every_metric_the_alert_rules_read_is_produced(produced):
    """An alert on a metric nobody produces never fires, and nothing says so."""
    text = (REPO / "monitoring" / "prometheus" / "alerts.yml").read_text()
    read = set(re.findall(r"\bgpulab_[a-z_]*[a-z]\b", text))
    assert read, "no gpulab_ metric found in alerts.yml"
    assert read - produced - produced_by_the_hub() == set()


UUIDS = [
    ("GPU-00000000-0000-0000-0000-000000000000", True),   # nvidia-smi -L
    ("GPU-fa4e0000-0000-4000-8000-00000000AbCd", True),
    ("MIG-6b7c8d9e-1111-2222-3333-444455556666", True),   # a MIG device (R470 and later)
    ("GPU-", False), ("GPU", False), ("gpu-0000", False), ("GPU-0000-", False),
    ("GPU-not-hex", False), ("MIG-GPU-0000/1/0", False), ("GPU-00 00", False),
    ("GPU-0000;rm", False),
]


@pytest.mark.parametrize("uuid,valid", UUIDS)
def test_a_gpu_uuid_is_one_shape_in_gpus_yaml_gpulab_yaml_and_the_docker_proxy(uuid, valid):
    """The UUID rule has one home (contract.GPU_UUID): the allocation config, the lab's
    settings and the Docker proxy accept and refuse the same strings."""
    from gpulab.gpus.config import ConfigError, parse_gpus_config
    from gpulab.settings import _gpu_refs

    assert bool(contract.GPU_UUID.fullmatch(uuid)) is valid
    try:
        parse_gpus_config(f"inventory:\n  - {{index: 0, uuid: {uuid!r}}}\n")
        in_gpus_yaml = True
    except ConfigError:
        in_gpus_yaml = False
    try:
        in_settings = _gpu_refs([uuid]) == (uuid,)
    except ValueError:
        in_settings = False
    assert (in_gpus_yaml, in_settings) == (valid, valid)


def test_a_new_server_finds_her_home_where_her_other_servers_remember_it():
    states = {"": {"home_node": "n1", "home_machine": "gpu-1"}, "train": None, "b": {}}
    assert contract.shared_home(states, "train") == ("n1", "gpu-1")
    assert contract.shared_home(states, None) == ("n1", "gpu-1")  # any server of hers
    assert contract.shared_home({"": {}, "train": None}, "train") == ("", "")
    assert contract.shared_home({"": {"home_node": "n1"}}, "") == ("", "")  # its own: not here
