"""gpulab's stack on a simulated Swarm's manager, brought up with ``make up-swarm`` as
docs/swarm.md says (tests/integration/test_swarm_hub.py, bench.spawn
--swarm). The swarm itself is tests/swarm's :class:`~tests.swarm.Swarm`, whose machines
already have the members' image (SWARM_IMAGES of the test module)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from tests.swarm.forward import Forward

from .probes import probe_with
from .stack import REPO, TOKEN_FILE, Hub, StackError, wait_for

# Copied onto every machine (no registry): the stack on the manager, the members' image and
# each GPU server's exporter (with its read-only Docker proxy, from the hub image).
IMAGES = ("gpulab/hub:latest", "gpulab/exporter:latest", "gpulab/prometheus:latest",
          "gpulab/singleuser:latest")
MANAGED = "org.gpulab.managed"

SETTINGS = """\
hub:
  admins: [admin]
  swarm: true
  idle_timeout: 0
spawn:
  image: gpulab/singleuser:latest
  network: gpulab
  datasets_volume: ""
  mem_limit: 1g
  cpu_limit: 1
  shm_size: 64m
  start_timeout: 2m
"""
GPUS = "inventory: auto\ndefaults: {gpus: 1, max_gpus: 2}\n"


class SwarmLab:
    """The hub's stack on the manager, and what the tests ask of it."""

    def __init__(self, swarm, root, gpus: str = GPUS):
        self.swarm, self.root, self.gpus = swarm, root, gpus
        self.manager = swarm.manager
        self.forward: Forward | None = None
        self.hub: Hub | None = None

    def docker(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        return self.swarm.docker(self.manager, *args, check=check, timeout=timeout)

    # ------------------------------------------------------------- the stack

    def make(self, target: str, node=None, timeout: float = 300, **variables: str) -> str:
        """``make TARGET`` of this checkout on *node* (default: the manager): in its
        network namespace, with its Docker engine, the test's config folder and the
        images already loaded; *variables* are more ``make`` variables."""
        node = node or self.manager
        sock = str(node.paths.socket)
        variables = {"BUILD_IMAGES": "no", "GPULAB_CONFIG": str(self.root / "config"),
                     "DOCKER_HOST": f"unix://{sock}", "GPULAB_DOCKER_SOCKET": sock,
                     "GPULAB_DOCKER_EXEC_ROOT": str(node.paths.exec),
                     "GPULAB_BACKUP_DIR": str(self.root / "backups"), **variables}
        out = subprocess.run(
            ["nsenter", f"--net=/run/netns/{node.plan.netns}", "--",
             "make", "-C", str(REPO), "--no-print-directory", target,
             *(f"{k}={v}" for k, v in variables.items())],
            capture_output=True, text=True, timeout=timeout,
            env={k: v for k, v in os.environ.items() if not k.startswith("GPULAB_")})
        print(f"----- make {target} on {node.name} -----\n{out.stdout}{out.stderr}")
        if out.returncode != 0:
            raise StackError(f"make {target} on {node.name} failed ({out.returncode}):\n"
                             f"{out.stdout[-3000:]}{out.stderr[-3000:]}")
        return out.stdout + out.stderr

    def start(self) -> None:
        config = self.root / "config"
        config.mkdir()
        (config / "gpulab.yaml").write_text(SETTINGS)
        (config / "gpus.yaml").write_text(self.gpus)
        shutil.copy(REPO / "config" / "alertmanager.yml", config / "alertmanager.yml")
        out = self.make("up-swarm")
        for worker in self.swarm.workers:  # the preflight lists the machines and GPUs
            assert f"{worker.hostname} " in out and "2 GPU(s)" in out, out
        # Each GPU server's netguard and exporter, with the fake GPUs its engine label lists.
        for worker in self.swarm.workers:
            self.make("swarm-node", worker, GPULAB_NODE_ADDRESS=worker.address,
                      GPULAB_EXPORTER_FLAGS=f"--fake-gpus {len(worker.gpus)} "
                                            f"--fake-uuids {','.join(worker.gpus)}")
        self.forward = Forward(self.manager.plan.netns, ("127.0.0.1", 8000))
        self.hub = Hub(self.forward.url, token=TOKEN_FILE.read_text().strip())
        self.wait_hub()

    def wait_hub(self, timeout: float = 90) -> None:
        def up():
            state = self.docker("inspect", "-f", "{{.State.Status}}", "gpulab-hub").strip()
            if state != "running":
                raise StackError(f"the hub is {state}:\n{self.logs('gpulab-hub')}")
            return self.hub.is_up()
        wait_for(up, timeout, interval=0.5, what="the hub on the manager to answer")

    def logs(self, container: str, tail: int = 60, node=None) -> str:
        """The log of *container* on *node* (default: the manager)."""
        node = node or self.manager
        out = subprocess.run(["docker", "-H", node.host, "logs", "--tail", str(tail),
                              container], capture_output=True, text=True, timeout=30)
        return out.stdout + out.stderr

    def close(self) -> None:
        if self.forward:
            self.forward.close()
        print("\n----- the hub's log (last lines) -----\n" + self.logs("gpulab-hub", 80))
        print("----- the Docker proxy's log -----\n" + self.logs("gpulab-docker-proxy", 30))
        self.make("down")

    # ------------------------------------------------------------- the Swarm's view

    def services(self) -> list[dict]:
        out = self.docker("service", "ls", "-q", "--filter", f"label={MANAGED}=true")
        ids = out.split()
        return json.loads(self.docker("service", "inspect", *ids)) if ids else []

    def placement(self) -> dict[str, tuple[str, str]]:
        """member -> (node hostname, GPU UUIDs) from the services' labels."""
        names = {n["ID"]: n["Description"]["Hostname"] for n in json.loads(
            self.docker("node", "inspect", *self.docker("node", "ls", "-q").split()))}
        return {s["Spec"]["Labels"]["org.gpulab.user"]:
                (names.get(s["Spec"]["Labels"]["org.gpulab.node"], "?"),
                 s["Spec"]["Labels"]["org.gpulab.gpus"]) for s in self.services()}

    def gpus_given(self, node) -> dict[str, str]:
        """container ID -> NVIDIA_VISIBLE_DEVICES, as the stand-in runtime on *node* saw
        them (the last record of each container)."""
        return {r["id"]: r["NVIDIA_VISIBLE_DEVICES"] for r in self.swarm.runtime_records(node)}

    def addresses(self) -> dict[str, tuple[str, str]]:
        """member -> (hostname of the machine her server runs on, its address on the
        users' overlay), from the services' running tasks."""
        names = {n["ID"]: n["Description"]["Hostname"] for n in json.loads(
            self.docker("node", "inspect", *self.docker("node", "ls", "-q").split()))}
        found = {}
        for s in self.services():
            ids = self.docker("service", "ps", "-q", "--no-trunc", "--filter",
                              "desired-state=running", s["ID"]).split()
            for task in json.loads(self.docker("inspect", *ids)) if ids else []:
                for attachment in task.get("NetworksAttachments") or []:
                    if attachment["Network"]["Spec"]["Name"] == "gpulab":
                        found[s["Spec"]["Labels"]["org.gpulab.user"]] = (
                            names[task["NodeID"]], attachment["Addresses"][0].split("/")[0])
        return found

    # ------------------------------------------------------------- the users' network

    def probe_from_machine(self, node, targets: dict[str, tuple[str, int]]) -> dict[str, str]:
        """*targets* as the machine *node* itself sees them (its network namespace)."""
        return probe_with(["nsenter", f"--net=/run/netns/{node.plan.netns}"], targets)

    def probe_from_container(self, container: str, targets: dict[str, tuple[str, int]]
                             ) -> dict[str, str]:
        """*targets* as one of the stack's containers on the manager sees them."""
        return probe_with(["docker", "-H", self.manager.host, "exec", container], targets)

    def gateway(self, node) -> str:
        """*node*'s address on its docker_gwbridge (overlay containers' way out)."""
        return self.swarm.docker(node, "network", "inspect", "-f",
                                 "{{(index .IPAM.Config 0).Gateway}}", "docker_gwbridge").strip()

    def overlay_netns(self, node):
        """Docker's network namespace of the users' overlay on *node* (exists while one of
        its containers runs there)."""
        network = self.docker("network", "inspect", "-f", "{{.Id}}", "gpulab").strip()
        return node.paths.exec / "netns" / f"1-{network[:10]}"
