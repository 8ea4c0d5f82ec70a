"""GpulabSwarmSpawner: a member's server as a Swarm service on the machine whose GPUs it
leased (``hub.swarm: true``; docs/swarm.md).

Everything a member and an admin see stays :class:`~gpulab.spawn.spawner.GpulabSpawner`'s: the
spawn form, user options validation, the lease taken before anything is created, the
progress bar, the ready check, the messages. What changes is where the server runs:

* the lease table (:func:`gpulab.gpus.leases.swarm_lease_book`) reads the GPUs from the
  nodes' engine labels before every allocation (a machine that is down or drained gives
  out nothing) and the leases from the services' labels, so a hub restart loses nothing;
* the allocator picks the machine with the GPUs (a server with no GPU goes to the least
  busy machine, :func:`~gpulab.spawn.swarm_services.node_for_cpu_server`);
* the service is :func:`~gpulab.spawn.swarm_services.service_spec`, created as built, through
  the Docker proxy in front of the manager (``gpulab-docker-proxy --swarm``), which
  checks it as strictly as a container create;
* whether the server runs is :func:`~gpulab.spawn.swarm_services.server_state`: a server whose
  machine went down or was drained, or whose task ended, is reported stopped, with the
  reason in the hub's log, and its service is removed, which releases its GPUs.

The hub reaches the server at its task's address on ``spawn.network``, an attachable
overlay network the hub and the proxy are attached to.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import docker.errors
from traitlets import Unicode, default

from gpulab import live_config, notices
from gpulab.contract import LABEL_MANAGED, LABEL_NODE, shared_home
from gpulab.gpus.allocator import AllocationError, NotEnoughGpus
from gpulab.gpus.leases import LeaseBook, swarm_lease_book
from gpulab.gpus.policy import policy_for
from gpulab.gpus.swarm_nodes import node_name, node_usable
from gpulab.settings import Settings
from gpulab.spawn import admission
from gpulab.spawn.admission import Ask
from gpulab.spawn.form import SpawnForm
from gpulab.spawn.spawner import GpulabSpawner, SpawnFailed, _http_error
from gpulab.spawn.swarm_services import (
    RUNNING,
    STARTING,
    landing_note,
    node_for_cpu_server,
    ran_a_container,
    server_state,
    service_spec,
    task_address,
)

STOP_GRACE_SECONDS = 10  # Swarm's default StopGracePeriod, which service_spec keeps
LANDING_NOTE_TIMEOUT = 5.0  # seconds the spawn form waits to say where a server goes


class GpulabSwarmSpawner(GpulabSpawner):
    object_type = "service"
    object_id_key = "ID"

    node_id = Unicode("", help="The Swarm node (ID) this server was placed on.")
    home_node = Unicode("", help="""The node (ID) that holds this server's home volume
        (spawn.swarm_homes: machine): where it ran first. Kept across stops.""")
    home_machine = Unicode("", help="""That node's hostname: a machine that leaves the
        Swarm and joins again gets a new ID, and keeps its name and its volumes.""")
    notices_file = Unicode(
        "",
        config=True,
        help="""Where the hub notes servers it found stopped (their machine went down,
        was drained, or their task ended), for their members' home pages
        (gpulab.notices' format). Empty: the hub's log only.""",
    )
    image_id = Unicode("", help="spawn.image's ID on the manager, for the start in progress")
    _home_where = Unicode("", help="the machine with her home, as the start in progress "
                                   "names it to her")
    ready_poll_interval_swarm = 0.2  # seconds between looks at a starting task

    @default("poll_interval")
    def _default_poll_interval(self):
        # A machine can go down under a running server: look every 10 s, so that its
        # GPUs come back soon after Swarm reports it down (JupyterHub's default is 30 s).
        return 10

    @property
    def lease_book(self) -> LeaseBook:
        return swarm_lease_book()

    @property
    def internal_hostname(self):
        return self.object_name

    # ------------------------------------------------------------- the Swarm's view

    async def _swarm_view(self) -> tuple[dict | None, list, list]:
        """(this server's service or None, its tasks, every node)."""
        try:
            service = await self.docker("inspect_service", self.object_name)
        except docker.errors.NotFound:
            return None, [], []
        tasks = await self.docker("tasks", filters={"service": service["ID"]})
        nodes = await self.docker("nodes")
        return service, tasks, nodes

    async def _running_task(self) -> dict | None:
        tasks = await self.docker("tasks", filters={"service": self.object_name,
                                                    "desired-state": "running"})
        return next((t for t in tasks if (t.get("Status") or {}).get("State") == RUNNING),
                    None)

    # ------------------------------------------------------------- start

    async def start(self):
        if self.notices_file:  # a notice of the last stop is news no more
            try:
                notices.forget_stopped(self.notices_file, self.user.name, self.name)
            except OSError as e:  # a member's start never fails on a notice
                self.log.warning("Could not update %s: %s", self.notices_file, e)
        return await super().start()

    async def _check_host_objects(self, settings: Settings) -> None:
        """``spawn.image`` on the manager: the service runs it by the ID it has there, so
        that no machine asks a registry for it. The machines must hold that same image
        (docs/swarm.md: how images reach them); one that does not fails the task, and the member
        reads why from :meth:`start_object`. Volumes are on the machines, which the
        manager cannot be asked about."""
        self.image_id = await self._image_id(settings, "the Swarm's manager")

    async def pull_image(self, image):
        """Nothing: the hub never pulls. The image is on the manager (checked before) and
        on the machines (docs/swarm.md: how images reach them), by the same ID."""

    def _home_machine(self, settings: Settings | None = None) -> str:
        """The node this server must run on ("" = any): where its home volume is. A
        server that never ran finds her home where her other servers' is (one home per
        member, unless spawn.home_volume names the server too)."""
        settings = settings or self._lab_config[0]
        if settings["spawn.swarm_homes"] != "machine":
            return ""
        if not self.home_node and "{servername}" not in settings["spawn.home_volume"]:
            states = {n: orm.state for n, orm in self.user.orm_user.orm_spawners.items()}
            self.home_node, self.home_machine = shared_home(states, self.name)
        return self.home_node

    def _ask(self, settings: Settings | None = None) -> Ask:
        """This start, on the machine with her home where homes are on the machines: the
        line waits for that machine by hostname, which it keeps when it joins the Swarm
        again under a new ID (by ID before one is known)."""
        ask = super()._ask(settings)
        home = self._home_machine(settings)
        if not home:
            return ask
        return replace(ask, machine=home, line_machine=self.home_machine or home,
                       machine_name=self._home_where or self.home_machine or home)

    # ------------------------------------------------------------- the spawn form

    async def _spawn_form(self) -> SpawnForm | None:
        """The spawn form, which also says on which machine the server would start."""
        form = await super()._spawn_form()
        if form is None:  # no GPU to choose: the progress bar names the machine
            return form
        try:
            note = await asyncio.wait_for(self._landing_note(), LANDING_NOTE_TIMEOUT)
        except Exception as e:  # the form never fails for want of this line
            self.log.warning("Could not tell %s where a server would start: %s",
                             self.log_name, e)
            return form
        return replace(form, landing=note)

    async def _landing_note(self) -> str:
        settings = live_config.settings_file.load(self.settings_file)
        config = live_config.gpus_file.load(self.gpus_file)
        nodes = await self.docker("nodes")
        names = {str(n.get("ID") or ""): node_name(n) for n in nodes}
        home = self._home_machine(settings)
        home_name = (self.home_machine or names.get(home, home)) if home else ""
        landings: dict[int, str] = {}
        if not home_name:
            policy = policy_for(config, self.user.name, [g.name for g in self.user.groups])
            services = await self.docker("services",
                                         filters={"label": f"{LABEL_MANAGED}=true"})
            landings[0] = names.get(node_for_cpu_server(nodes, services), "")
            counts = range(1, policy.max_gpus + 1)
            inventory = self.lease_book.inventory(config, quiet=True)  # the form's look
            usage = self._usage()
            async with self.lease_book.locked(inventory) as table:
                seen = self._seen(config, inventory, table.leases, usage)
            previews = admission.preview(self._ask(settings), seen, counts)
            for count, got in zip(counts, previews, strict=True):
                if isinstance(got, NotEnoughGpus):  # none free enough on any one machine
                    landings[count] = ""
                elif not isinstance(got, AllocationError) and got:
                    landings[count] = got[0].machine
                # else over her quota (the start says so): no machine to name
        up = any(node_usable(n) for n in nodes  # by name too: it may have joined again
                 if str(n.get("ID")) == home or (home_name and node_name(n) == home_name))
        return landing_note(settings["spawn.swarm_homes"], home_name, landings, up)

    async def _lease(self, gpus_config) -> list:
        nodes = await self.docker("nodes")
        home = self._home_machine()
        if home:
            node = next((n for n in nodes if n.get("ID") == home), None)
            if node is None and self.home_machine:  # it joined again, under a new ID
                node = next((n for n in nodes if node_name(n) == self.home_machine), None)
                if node is not None:
                    self.home_node = home = str(node.get("ID"))
            where = self.home_machine or (node_name(node) if node else home)
            self._home_where = where  # what a 409 says (admission.where)
            if node is None or not node_usable(node):
                raise _http_error(
                    503, f"Your files are on the lab's machine {where}, which is "
                         f"{'gone from the cluster' if node is None else 'down or out of service'}"
                         f", so your server cannot start until it is back; tell an admin "
                         f"if it stays away.")
        gpus = await super()._lease(gpus_config)
        if gpus:
            self.node_id = gpus[0].node  # the allocator keeps a server on one machine
            return gpus
        services = await self.docker("services", filters={"label": f"{LABEL_MANAGED}=true"})
        self.node_id = home or node_for_cpu_server(nodes, services)
        if not self.node_id:
            self.lease_book.settle(self.user.name, self.name)
            raise _http_error(503, "No machine of the lab is up to run your server; try "
                                   "again later, or tell an admin.")
        return gpus

    async def _machine_cpus(self) -> int | None:
        """The CPUs of the machine the Swarm will run her server on (its node's)."""
        try:
            nodes = await self.docker("nodes")
        except Exception as e:  # a start never fails for want of this figure
            self.log.warning("Could not ask the Swarm for its machines' CPUs: %s", e)
            return None
        node = next((n for n in nodes if n.get("ID") == self.node_id), None)
        nano = ((node or {}).get("Description") or {}).get("Resources", {}).get("NanoCPUs")
        return int(nano // 1e9) if nano else None

    async def get_object(self):
        try:
            return await self.docker("inspect_service", self.object_name)
        except docker.errors.NotFound:
            return None

    async def create_object(self):
        settings = self._lab_config[0]
        spec = service_spec(settings, self.user.name, self.name, self.gpu_uuids,
                            self.node_id, self.image_id, env=self.get_env(),
                            gpu_share=self._gpu_share, resources=self._resources,
                            job=self._job, projects=self._projects,
                            command=await self.get_command())
        return await self.docker(
            "create_service", spec["TaskTemplate"], name=spec["Name"], labels=spec["Labels"],
            mode=spec["Mode"], endpoint_spec=spec["EndpointSpec"])

    async def _wait_running(self):
        """Wait until the service's task runs on its machine; a task that ends first
        fails the spawn with the Swarm's reason and the end of the server's log."""
        said_waiting = False
        while True:
            service, tasks, nodes = await self._swarm_view()
            if service is None:
                raise SpawnFailed("Your server's service disappeared while starting "
                                  "(removed from outside the hub). Start it again.")
            state = server_state(service, tasks, nodes)
            if state.state == RUNNING:
                return
            if state.state != STARTING:
                self.log.warning("Start of %s failed: %s", self.log_name, state.reason)
                if not ran_a_container(tasks):  # no log, and no GPU held on the machine
                    await self.remove_object(cool=False)
                    raise SpawnFailed(f"Your server could not start: {state.reason}.")
                log_tail = await self._log_tail()
                await self.remove_object()
                raise SpawnFailed(f"Your server could not start: {state.reason}. "
                                  f"Last lines of its log:\n{log_tail}")
            if time.monotonic() > self._start_deadline:
                newest = max(tasks, key=lambda t: (t.get("Version") or {}).get("Index", 0),
                             default={})
                status = newest.get("Status") or {}
                await self.remove_object()
                raise SpawnFailed(
                    f"Your server did not start within {self.start_timeout} seconds, so it "
                    f"was removed. The Swarm said: {status.get('State', 'no task yet')}"
                    f"{': ' + status['Message'] if status.get('Message') else ''}"
                    f"{' (' + status['Err'] + ')' if status.get('Err') else ''}. "
                    f"Try again; if it happens again, tell an admin.")
            if not said_waiting:
                where = next((node_name(n) for n in nodes if n.get("ID") == self.node_id),
                             self.node_id)
                self._report(40, f"Starting your server on {where}")
                said_waiting = True
            await asyncio.sleep(self.ready_poll_interval_swarm)

    async def start_object(self):
        await self._wait_running()
        if not self.home_node:  # its home volume now exists on this machine
            await self._remember_home(self.node_id)

    async def _remember_home(self, node_id: str) -> None:
        nodes = await self.docker("nodes")
        self.home_node = node_id
        self.home_machine = next((node_name(n) for n in nodes if n.get("ID") == node_id), "")

    async def get_ip_and_port(self):
        task = await self._running_task()
        address = task_address(task or {}, self.network_name)
        ended = None if task else await self._ended()
        if ended is not None:  # it ended between running and here
            log_tail = await self._log_tail()
            await self.remove_object()
            raise SpawnFailed(f"Your server exited while starting ({ended}). "
                              f"Last lines of its log:\n{log_tail}")
        if not address:
            raise SpawnFailed(f"Your server runs but has no address on the network "
                              f"{self.network_name}; tell an admin (spawn.network must be "
                              f"an attachable overlay network the hub is on).")
        return address, self.port

    async def _ended(self) -> str | None:
        service, tasks, nodes = await self._swarm_view()
        if service is None:
            raise SpawnFailed("Your server's service disappeared while starting "
                              "(removed from outside the hub). Start it again.")
        state = server_state(service, tasks, nodes)
        return None if state.state in (RUNNING, STARTING) else state.reason

    # ------------------------------------------------------------- state

    def get_state(self):
        state = super().get_state()
        if self.home_node:
            state["home_node"] = self.home_node
            state["home_machine"] = self.home_machine
        return state

    def load_state(self, state):
        super().load_state(state)
        self.home_node = state.get("home_node", "")
        self.home_machine = state.get("home_machine", "")

    def clear_state(self):
        # A stop clears the server's state, not where its home is.
        home = (self.home_node, self.home_machine)
        super().clear_state()
        self.home_node, self.home_machine = home

    # ------------------------------------------------------------- running, stopping

    async def poll(self):
        """None while the server runs (or starts); else why it stopped. A stopped
        server's service is removed here, which releases its GPUs: JupyterHub calls
        stop() only for servers it believes run."""
        service, tasks, nodes = await self._swarm_view()
        if service is None:
            return 0
        if not self.home_node:
            # JupyterHub saves the state only once start() returns: a hub killed while
            # the server was starting learns where its home is from the service's label.
            await self._remember_home(
                ((service.get("Spec") or {}).get("Labels") or {}).get(LABEL_NODE, ""))
        state = server_state(service, tasks, nodes)
        if state.state in (RUNNING, STARTING):
            return None
        self.log.warning("%s stopped: %s; removing its service, which releases its GPUs",
                         self.log_name, state.reason)
        await self.remove_object()
        if self.notices_file:
            try:
                notices.record_stopped(self.notices_file, notices.Stopped(
                    self.user.name, self.name, time.time(), notices.MACHINE, state.reason))
            except OSError as e:
                self.log.warning("Could not tell %s why: %s", self.log_name, e)
        self.lease_book.settle(self.user.name, self.name)
        return state.reason

    async def stop_object(self):
        """A service has no stop: :meth:`remove_object` removes it (``remove`` is on)."""

    async def remove_object(self, cool: bool = True):
        """Remove the service, which releases its GPUs; with *cool*, they stay busy while
        its container on the machine may still be stopping."""
        try:
            await self.docker("remove_service", self.object_name)
        except docker.errors.NotFound:
            return
        if cool:  # its container gets up to Swarm's stop grace period to end
            self.lease_book.cool(self.gpu_uuids, STOP_GRACE_SECONDS + 2)

    async def _remove_leftover(self) -> None:
        try:
            await self.remove_object()
            self.log.info("Removed %s left by a start that was given up", self.object_name)
        except docker.errors.APIError as e:
            self.log.warning("Could not remove %s after a given-up start: %s",
                             self.object_name, e)

    async def _log_tail(self, lines: int = 20) -> str:
        def read() -> bytes:
            return b"".join(self.client.service_logs(
                self.object_name, stdout=True, stderr=True, tail=lines, is_tty=False))
        try:
            out = await asyncio.wait_for(asyncio.to_thread(read), 10)
        except Exception as e:  # the service or its machine may already be gone
            return f"(log unavailable: {e or type(e).__name__})"
        return out.decode("utf-8", "replace").strip()
