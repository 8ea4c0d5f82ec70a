"""GpulabSpawner: DockerSpawner with GPU leases, gpulab's settings, progress and a fast ready check.

Only what gpulab needs is changed; the Docker work itself stays DockerSpawner's:

* Before each start, ``config/gpulab.yaml`` and ``config/gpus.yaml`` are read again
  (:mod:`gpulab.live_config`: an admin's edit takes effect at the next spawn, an
  invalid edit is refused and the last good file stays in force).
* ``user_options`` (from the spawn form or straight from the REST API) are validated
  before anything is created: anything but ``{"gpus": 0..quota, "wait": bool,
  "environment": NAME}`` is a 400 (:mod:`gpulab.environments`: the server runs
  the chosen environment's image).
* GPUs are leased (:mod:`gpulab.gpus.leases`) before the container is created; no free GPU
  or an exceeded quota is a 4xx with a message that says what to do.
  :func:`gpulab.spawn.containers.container_options` then decides image, volumes, limits,
  hardening and the DeviceRequest for exactly the leased GPUs.
* Container names come from :mod:`gpulab.spawn.naming` (collision-free for any username).
* The DockerSpawner traits gpulab sets come from gpulab.yaml, unless the hub's config
  file sets them itself: then the config file wins, or the spawn is refused when the
  trait carries the lease or the Docker proxy's rules (:mod:`gpulab.spawn.traits`).
* ``progress()`` reports each step to the spawn page's progress bar.
* ``start()`` returns only once the server answers HTTP, polling every 0.1 s, so the
  hub's own readiness check (exponential backoff up to 5 s) passes at its first try,
  and a container that exits while starting fails the spawn at once, with the end of
  its log in the message, instead of after the start timeout.
"""

from __future__ import annotations

import asyncio
import html
import os
import sqlite3
import time

import docker.errors
from dockerspawner import DockerSpawner
from jupyterhub.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Any, Dict, Float, Int, List, Unicode, default
from traitlets.config import Configurable

from gpulab import compat, live_config, shares
from gpulab.bookings.store import booking_store
from gpulab.contract import PROJECTS_PATH
from gpulab.environments import (
    Environment,
    EnvironmentRefused,
    choose,
    lab_environments,
    open_to,
    with_environment,
)
from gpulab.gpus.leases import LeaseBook, lease_book, log_orphans
from gpulab.gpus.policy import (
    ServerResources,
    cpus_text,
    memory_text,
    policy_for,
    policy_note,
    sizes_note,
)
from gpulab.gpus.sharing import merged_env, server_share
from gpulab.line import usage as line_usage
from gpulab.line.spawning import LINE_HOME_LINK, LineAtSpawn
from gpulab.line.store import line_store
from gpulab.mail import enabled as mail_enabled
from gpulab.settings import ConfigError, Settings, bytes_text
from gpulab.spawn import admission
from gpulab.spawn.admission import Admitted, Ask, JoinLine, Seen
from gpulab.spawn.containers import (
    container_options,
    home_volume_create,
    project_volume_create,
)
from gpulab.spawn.form import SpawnForm, gpu_rows, render_spawn_form
from gpulab.spawn.naming import container_name
from gpulab.spawn.reused import still_choosable
from gpulab.spawn.traits import AdminTrait, admin_traits, apply_admin_traits, trait_values


class SpawnFailed(web.HTTPError):
    """A start that failed in the user's container, with a message meant for the user.

    An HTTPError so that the REST API answers with the message itself, not a bare
    "Internal Server Error"; JupyterHub's spawn page shows ``jupyterhub_message``.
    """

    def __init__(self, message: str):
        super().__init__(500, "%s", message)
        self.jupyterhub_message = message


def policy_refusal(error: docker.errors.APIError) -> str | None:
    """The reason gpulab's Docker proxy gave for refusing a call, or None when the error
    came from somewhere else (dockerd itself, the network)."""
    explanation = str(getattr(error, "explanation", "") or "")
    prefix = "gpulab docker-proxy: "
    # 503: on a Swarm, spawn.image left the manager between the hub's check and the create
    if error.status_code in (400, 403, 503) and explanation.startswith(prefix):
        return explanation[len(prefix):]
    return None


_logged: set[str] = set()


def _log_once(log, line: str) -> None:
    """Say *line* the first time in this hub process (it holds at every spawn)."""
    if line not in _logged:
        _logged.add(line)
        log(line)


def _http_error(status: int, message: str) -> web.HTTPError:
    err = web.HTTPError(status, "%s", message)
    err.jupyterhub_message = message
    return err


class GpulabSpawner(DockerSpawner):
    settings_file = Unicode(
        "/srv/gpulab/config/gpulab.yaml",
        config=True,
        help="""Path of gpulab's settings file (see config/gpulab.yaml), read again at
        every spawn. Example: c.GpulabSpawner.settings_file = "/etc/gpulab/gpulab.yaml"
        """,
    )
    gpus_file = Unicode(
        "/srv/gpulab/config/gpus.yaml",
        config=True,
        help="""Path of the GPU allocation file (see config/gpus.yaml), read again at
        every spawn. A missing file means: GPUs found by NVML, exclusive, 0 by default,
        at most 1 per user.""",
    )
    line_file = Unicode(
        "",
        config=True,
        help="""Path of the SQLite file that keeps the members waiting in line for GPUs
        (gpulab.line); "" for no line (a spawn without free GPUs is refused, as
        always). Example: c.GpulabSpawner.line_file = "/srv/jupyterhub/gpulab-line.sqlite"
        """,
    )
    bookings_file = Unicode(
        "",
        config=True,
        help="""Path of the SQLite file of members' bookings of GPUs (gpulab.bookings); ""
        for none. While a booking runs, its GPUs are kept for its member: her spawns get
        them first, nobody else's gets them. Example:
        c.GpulabSpawner.bookings_file = "/srv/jupyterhub/gpulab-bookings.sqlite"
        """,
    )
    usage_file = Unicode(
        "",
        config=True,
        help="""Path of the file of members' GPU-hours that the line service writes from
        Prometheus (gpulab.line.usage), which budgets are enforced by, with or without a
        line; "" for the one beside line_file (none without a line: no budget is then
        enforced). Example: c.GpulabSpawner.usage_file = "/srv/jupyterhub/gpulab-usage.json"
        """,
    )
    ready_poll_interval = Float(
        0.1,
        config=True,
        help="""Seconds between readiness checks of a starting server (default 0.1).""",
    )

    # Per-instance state (traits, so that no two spawners share a list or dict).
    _lab_config = Any(help="(settings, gpus config) read for the spawn in progress")
    _environment = Any(help="the environment of the spawn in progress (Environment)")
    _progress_events = List()
    _gpulab_env = Dict()
    _gpu_share = Int(1, help="max_users of the most shared GPU of the spawn in progress "
                             "(1: none shared, or an image without the cap's label), for "
                             "its PyTorch memory cap")
    _image_labels = Dict(help="the labels of the image of the spawn in progress")
    _booked_note = Unicode(help="what she is told of a booking of her GPUs by another "
                                "member (admission.booked_note), for the spawn in progress")
    _resources = Any(help="the CPUs and memory of the spawn in progress (ServerResources)")
    _job = Any(None, help="the job the spawn in progress runs (gpulab.spawn.jobs.Job), if any")
    _projects = Any((), help="her groups' project folders the spawn in progress mounts")
    gpu_uuids = List(help="UUIDs of the GPUs this server holds (empty when stopped).")
    _start_deadline = Float(0.0, help="time.monotonic() by which the start gives up, "
                                      "with a message (a little before start_timeout)")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Said when the hub starts (it makes a spawner per server it knows), not only at
        # the first spawn, which refuses or honours each of them again.
        if self.admin_traits:
            try:
                self._admin_traits_applied(live_config.settings_file.load(self.settings_file))
            except (ConfigError, web.HTTPError):
                pass  # said at the spawn, which is refused

    @default("prefix")
    def _default_prefix(self):
        return "gpulab"

    @default("cmd")
    def _default_cmd(self):
        # Not the image's CMD: an image without one (or with another) still starts the
        # single-user server, and a broken image fails with its own log, not a TypeError.
        return ["jupyterhub-singleuser"]

    @default("object_name")
    def _object_name_default(self):
        # DockerSpawner re-renders the name through this method, by its name, when the
        # image changes (gpulab.compat lists it).
        return container_name(self.user.name, self.name)

    @default("options_form")
    def _default_options_form(self):
        return self._gpu_options_form

    @default("options_from_form")
    def _default_options_from_form(self):
        # Only unwrap the form's one-element lists; start() validates whatever arrives,
        # from the form or straight from the REST API.
        return compat.simple_options_from_form(self)

    @property
    def lease_book(self) -> LeaseBook:
        """The hub's one lease table, shared by every spawner."""
        return lease_book()

    def _ask(self, settings: Settings | None = None) -> Ask:
        """This start, as :mod:`gpulab.spawn.admission` decides it (a Swarm's spawner adds
        the machine her home is on, by *settings*: the lab's as read for this spawn)."""
        return Ask(self.user.name, self.name, tuple(g.name for g in self.user.groups),
                   admin=self.user.admin, options=self.user_options,
                   from_form=not compat.from_rest_api(getattr(self, "handler", None)),
                   environment=self._environment, running=self._others_running())

    def _others_running(self) -> tuple[str, ...]:
        """Her other servers running or starting now (max_servers counts them)."""
        return tuple(sorted(name for name, s in self.user.spawners.items()
                            if name != self.name and s.active))

    def _usage(self) -> line_usage.Usage:
        """Members' GPU-hours as the line service last wrote them (budgets, fair share)."""
        path = self.usage_file or (line_store(self.line_file).usage_path
                                   if self.line_file else "")
        return line_usage.read(path, time.time()) if path else line_usage.NONE

    def _seen(self, config, inventory, leases, usage: line_usage.Usage) -> Seen:
        """What a decision reads, besides the lease table: read under its lock, so that a
        booking that starts now or a place the line just offered is counted."""
        settings = self._lab_config[0] if self._lab_config else None
        base = ({"base_cpus": settings["spawn.cpu_limit"],
                 "base_memory": settings["spawn.mem_limit"]} if settings else {})
        return Seen(config, tuple(inventory), tuple(leases), time.time(), **base,
                    bookings=tuple(self._bookings()),
                    line=tuple(line_store(self.line_file).entries()) if self.line_file
                    else None,
                    usage=usage,
                    mail_on=bool(settings) and mail_enabled(settings),
                    lists_environments=bool(settings) and bool(settings["spawn.environments"]))

    def _bookings(self) -> list:
        """Members' bookings; none (logged) when the store cannot be read: a broken store
        costs the bookings, never every spawn."""
        if not self.bookings_file:
            return []
        try:
            return booking_store(self.bookings_file).bookings()
        except (OSError, sqlite3.Error) as e:
            self.log.error("The bookings' store %s cannot be read, so no booking keeps its "
                           "GPUs now: %s", self.bookings_file, e)
            return []

    @property
    def log_name(self) -> str:
        """This server as JupyterHub's log names it (``alice``, ``alice:train``)."""
        return compat.spawner_log_name(self)

    # ------------------------------------------------------------- options

    async def _gpu_options_form(self, spawner=None) -> str:
        """The spawn form (:mod:`gpulab.spawn.form`); empty (no form) when the user can
        have no GPU or the host has none."""
        form = await self._spawn_form()
        return render_spawn_form(form) if form else ""

    async def _spawn_form(self) -> SpawnForm | None:
        """What the spawn form shows: the environments she may choose (when the lab has
        several), how many GPUs, and which are free."""
        config = live_config.gpus_file.load(self.gpus_file)
        groups = [g.name for g in self.user.groups]
        policy = policy_for(config, self.user.name, groups)
        settings = live_config.settings_file.load(self.settings_file)
        envs = open_to(lab_environments(settings), groups, self.user.admin)
        choices = tuple((e.name, e.label()) for e in envs) if len(envs) > 1 else ()
        without = bool(choices) and not all(e.gpus for e in envs)
        inventory = await self.lease_book.current_inventory(config)
        if policy.no_gpu or policy.max_gpus == 0 or not inventory:
            return SpawnForm(0, 0, (), environments=choices) if choices else None
        ask, usage = self._ask(settings), self._usage()
        async with self.lease_book.locked(inventory) as table:
            seen = self._seen(config, inventory, table.leases, usage)
        holders = admission.holders(ask, seen, [g.uuid for g in inventory])
        # Holders' names are for admins: whoever looks at the form (JupyterHub sets the
        # handler before rendering it; an admin may open /hub/spawn/OTHER), else its owner.
        viewer = getattr(getattr(self, "handler", None), "current_user", None)
        is_admin = bool(getattr(viewer, "admin", False)) or self.user.admin
        budget = admission.budget_of(ask, seen, policy)
        line = seen.line is not None
        sized = sizes_note(policy, envs, settings["spawn.cpu_limit"], settings["spawn.mem_limit"])
        # her other servers' GPUs count toward max_gpus: she is offered what is left
        left = max(0, policy.max_gpus - sum(le.user == self.user.name and le.server != self.name
                                            for le in seen.leases))
        return SpawnForm(left, min(policy.gpus, left),
                         gpu_rows(inventory, holders, is_admin, self.user.name),
                         policy_note(policy, config.culling), line=line,
                         waiting=sum(e.offered_at is None for e in seen.line or ()),
                         email=line and mail_enabled(settings),
                         budget=budget.note() if budget else "", resources=sized,
                         environments=choices,
                         environments_without_gpus=without)

    # ------------------------------------------------------------- progress

    def _report(self, progress: int, message: str) -> None:
        self.log.info("%s: %s", self.log_name, message)
        self._progress_events.append({"progress": progress, "message": message})

    async def progress(self):
        sent = 0
        while True:
            while sent < len(self._progress_events):
                yield self._progress_events[sent]
                sent += 1
            await asyncio.sleep(0.1)  # JupyterHub stops reading when the spawn ends

    # ------------------------------------------------------------- start / stop

    def apply_settings(self, settings: Settings, gpu_uuids=(), gpu_share: int = 1,
                       resources: ServerResources | None = None) -> None:
        """Copy gpulab's decisions onto DockerSpawner's traits (gpulab.spawn.traits: the
        admin's own config-file traits are already in *settings*, or refused)."""
        opts = container_options(settings, self.user.name, self.name, gpu_uuids, gpu_share,
                                 resources, self._job, self._projects)
        for name, value in trait_values(settings, opts).items():
            setattr(self, name, value)
        self._gpulab_env = opts.environment

    async def _within_the_machine(self, resources: ServerResources | None
                                  ) -> ServerResources | None:
        """Her CPUs, said, and no more than the machine has: a CFS quota above its cores
        gives nothing, and her libraries would start a thread per CPU she does not get."""
        if resources is None:
            return None
        cores = await self._machine_cpus()
        if cores and resources.cpus > cores:
            self._report(17, f"Your server gets {cpus_text(cores)}: gpulab.yaml and "
                             f"gpus.yaml give you {cpus_text(resources.cpus)}, but the "
                             f"machine it runs on has only {cores}")
            resources = ServerResources(float(cores), resources.memory)
        self._report(18, f"Your server has {cpus_text(resources.cpus)} and "
                         f"{memory_text(resources.memory)} of memory")
        return resources

    async def _machine_cpus(self) -> int | None:
        """The CPUs of the machine her server runs on (None: not known): on one host, the
        hub's own, beside it (Docker's /info is not among what the hub may ask of its
        Docker proxy, and this costs a spawn nothing)."""
        return len(os.sched_getaffinity(0))

    def get_env(self):
        return merged_env(super().get_env(), self._gpulab_env)

    def _read_lab_config(self):
        try:
            settings = live_config.settings_file.load(self.settings_file)
            gpus_config = live_config.gpus_file.load(self.gpus_file)
        except ConfigError as e:
            self.log.error("Cannot spawn %s: %s", self.log_name, e)
            raise _http_error(
                503, f"The lab's configuration is invalid, so servers cannot start; "
                     f"an admin must fix it: {e}") from None
        return self._admin_traits_applied(settings), gpus_config

    def _admin_traits_applied(self, settings: Settings) -> Settings:
        """*settings* with the admin's honoured config-file traits in place (each said
        once in the hub's log); a 503 for an admin when one is refused."""
        settings, honoured, refused = apply_admin_traits(settings, self.admin_traits)
        for line in honoured:
            _log_once(self.log.warning, line)
        for line in refused:
            _log_once(self.log.error, f"Servers cannot start: {line}")
        if refused:
            raise _http_error(
                503, f"The hub's configuration sets a spawner option gpulab decides, so "
                     f"servers cannot start; an admin must fix it: {'; '.join(refused)}.")
        return settings

    @property
    def admin_traits(self) -> tuple[AdminTrait, ...]:
        """The traits gpulab sets at each spawn that the hub's config file sets too."""
        classes = [c.__name__ for c in type(self).mro() if issubclass(c, Configurable)]
        return admin_traits(self.config, classes)

    async def _lease(self, gpus_config) -> list:
        """Her GPUs, leased (:mod:`gpulab.spawn.admission` decides, under the lease
        table's lock), or the HTTP error that says why not; or her place in line."""
        ask, usage = self._ask(), self._usage()
        inventory = await self.lease_book.current_inventory(gpus_config)
        async with self.lease_book.locked(inventory) as table:
            decision = admission.decide(ask, self._seen(gpus_config, inventory,
                                                        table.leases, usage))
            if isinstance(decision, Admitted):
                table.record(decision.request, decision.gpus, decision.taken)
        if not isinstance(decision, Admitted):
            if decision.log:
                self.log.info("Spawn of %s refused: %s", self.log_name, decision.log)
            if decision.join is not None:
                raise await self._join_line(ask, gpus_config, decision.join)
            raise _http_error(decision.status, decision.message)
        log_orphans(gpus_config, inventory, decision.taken)
        if decision.leaves_line and line_store(self.line_file).remove(self.user.name,
                                                                     self.name):
            self.log.info("%s left the line: it got its GPUs", self.log_name)
        self._booked_note = decision.booked_note
        self._resources = decision.resources
        self._job = decision.job
        self._projects = decision.policy.projects
        return list(decision.gpus)

    async def _join_line(self, ask: Ask, gpus_config, join: JoinLine) -> web.HTTPError:
        """Put this server in line for the GPUs *join* names, to be told at its e-mail
        address when her turn comes: the 202 that says so (a 303 to her home page from
        the spawn form), or the 409 if waiting could never serve it."""
        inventory = await self.lease_book.current_inventory(gpus_config)
        line = LineAtSpawn(line_store(self.line_file), ask.user, ask.server, ask.groups)
        joined = line.join(gpus_config, inventory, join.count, join.environment,
                           join.email, join.machine, join.job)
        if joined.status != 202:
            return _http_error(joined.status, admission.where(ask, joined.message))
        said = _http_error(joined.status, joined.message)
        self.log.info("%s waits in line for %d GPU(s): %s", self.log_name, join.count,
                      joined.message)
        if ask.from_form:
            # The spawn form: to her home page, which shows her place. JupyterHub's form
            # handler answers with the error's status and headers when the spawn ends
            # within 1 s; later (a busy hub) she is on the spawn-pending page by then, and
            # the link's class sends her on (templates/spawn_pending.html, and
            # not_running.html where she opens that page after the spawn ended).
            home = url_path_join(self.hub.base_url, "home")
            said.status_code = 303
            said.headers = {"Location": home}
            said.joined_line = True  # the templates send her home
            said.jupyterhub_html_message = (
                f'{html.escape(joined.message)} <a class="{LINE_HOME_LINK}" '
                f'href="{html.escape(home)}">Your home page</a> shows your place.')
        return said

    async def _drop_what_is_gone(self, settings: Settings, gpus_config) -> None:
        """JupyterHub starts this server with the options of her last start (the request
        gave none): keep only what she could choose now (:mod:`gpulab.spawn.reused`)."""
        groups = [g.name for g in self.user.groups]
        policy = policy_for(gpus_config, self.user.name, groups)
        inventory = await self.lease_book.current_inventory(gpus_config)
        most = 0 if policy.no_gpu or not inventory else min(policy.max_gpus, len(inventory))
        open_now = [(e.name, e.gpus) for e in open_to(lab_environments(settings), groups,
                                                      self.user.admin)]
        self.user_options, said = still_choosable(self.user_options, most_gpus=most,
                                                  environments=open_now)
        for line in said:
            self._report(6, line)

    def _choose_environment(self, settings: Settings) -> Environment:
        """The environment her options ask for (:mod:`gpulab.environments`)."""
        try:
            return choose(settings, self.user_options, [g.name for g in self.user.groups],
                          self.user.admin)
        except EnvironmentRefused as e:
            self.log.info("Spawn of %s refused: %s", self.log_name, e)
            raise _http_error(e.status, str(e)) from None

    async def _preflight(self, settings: Settings) -> None:
        """Check what would otherwise fail halfway (or worse, half-succeed) before
        anything is leased or created, and say what an admin must do."""
        try:
            await self.docker("ping")
        except Exception as e:
            self.log.error("Docker engine unreachable while spawning %s: %s", self.log_name, e)
            raise _http_error(503, "The Docker engine on this host is not answering, so "
                                   "servers cannot start right now. Try again in a minute; "
                                   "if it persists, tell an admin.") from None
        await self._check_host_objects(settings)
        await self._ensure_home(settings)

    async def _check_host_objects(self, settings: Settings) -> None:
        """The image and the datasets volume are on this host (a Swarm's spawner checks
        the image on the manager; the machines cannot be asked about theirs)."""
        await self._image_id(settings, "this host")
        volume = settings["spawn.datasets_volume"]
        if volume:
            try:
                await self.docker("inspect_volume", volume)
            except docker.errors.NotFound:
                raise _http_error(
                    503, f"The shared datasets volume {volume!r} does not exist; an admin "
                         f"must create it (docker volume create {volume}) or set "
                         f"spawn.datasets_volume to '' in gpulab.yaml.") from None

    async def _ensure_home(self, settings: Settings) -> None:
        """With ``spawn.home_size``: a new home is created with that size now (Docker
        creates a home without a size itself, with the container). A home made before
        keeps what it was made with."""
        await self._ensure_sized(home_volume_create(settings, self.user.name, self.name),
                                 "spawn.home_size", settings, "Your home", "homes")

    async def _ensure_projects(self, settings: Settings) -> None:
        """Her groups' project folders, with ``spawn.project_size``, as homes are."""
        for project in self._projects:
            await self._ensure_sized(project_volume_create(settings, project),
                                     "spawn.project_size", settings,
                                     f"The project folder {PROJECTS_PATH}/{project}",
                                     "project folders")

    async def _ensure_sized(self, create: dict | None, setting: str, settings: Settings,
                            what: str, kind: str) -> None:
        """Create *create*'s volume of the size *setting* gives, unless it exists (it then
        keeps the size it was made with); a 503 naming *what* where Docker cannot."""
        if create is None:
            return
        name, size = create["name"], bytes_text(settings[setting])
        try:
            volume = await self.docker("inspect_volume", name)
        except docker.errors.NotFound:
            pass
        else:
            made = (volume.get("Options") or {}).get("size")
            if made != create["driver_opts"]["size"]:
                was = f"with a size of {made} bytes" if made else "without a size"
                _log_once(self.log.warning,
                          f"{name} was made {was}: {setting} ({size}) applies to "
                          f"{kind} made after it was set (docs/backups-and-upgrades.md, "
                          f"Home sizes)")
            return
        try:
            await self.docker("create_volume", **create)
        except docker.errors.APIError as e:
            said = policy_refusal(e) or str(getattr(e, "explanation", "") or e)
            self.log.error("Could not create %s's volume %s of %s: %s", self.log_name, name,
                           size, said)
            raise _http_error(
                503, f"{what} cannot be made: the lab limits {kind} to {size} "
                     f"({setting}), and this host's Docker could not apply that "
                     f"limit ({said}). An admin must put Docker's volumes on XFS with "
                     f"project quotas or remove {setting} (docs/backups-and-upgrades.md, "
                     f"Home sizes).") from None
        self.log.info("Created %s's volume %s of %s", self.log_name, name, size)

    async def _image_id(self, settings: Settings, where: str) -> str:
        """``spawn.image``'s ID on the engine the hub talks to (*where*, in words), or a
        503 saying what an admin must do; its labels are kept for the spawn."""
        image = settings["spawn.image"]
        try:
            info = await self.docker("inspect_image", image)
            self._image_labels = (info.get("Config") or {}).get("Labels") or {}
            return info["Id"]
        except docker.errors.NotFound:
            raise _http_error(503, f"The server image {image} is not on {where}; an admin "
                                   f"must build it (make images) or fix spawn.image (or the "
                                   f"environment's image in spawn.environments).") from None

    def run_pre_spawn_hook(self):
        # JupyterHub reads start_timeout right after calling start(), so the settings
        # (spawn.start_timeout among them) are read here, just before.
        self._lab_config = self._read_lab_config()
        self.start_timeout = self._lab_config[0]["spawn.start_timeout"]
        return super().run_pre_spawn_hook()

    async def start(self):
        self._progress_events = []
        self._report(5, "Checking the lab's settings")
        settings, gpus_config = self._lab_config
        if self.user_options and compat.options_reused(getattr(self, "handler", None)):
            await self._drop_what_is_gone(settings, gpus_config)
        self._environment = self._choose_environment(settings)
        settings = with_environment(settings, self._environment)
        if len(lab_environments(self._lab_config[0])) > 1:
            self._report(8, f"Environment: {self._environment.label()}")
        # A little before JupyterHub's own start_timeout, which would only say "Spawn
        # failed" (its TimeoutError carries no message): this one says why, with the log,
        # once the container is stopped (seen: 2 s were too few on a busy host).
        deadline = time.monotonic() + self.start_timeout - min(5.0, self.start_timeout / 5)
        self._start_deadline = deadline
        await self._preflight(settings)

        gpus = await self._lease(gpus_config)
        try:
            try:
                self.gpu_uuids = [g.uuid for g in gpus]
                self._gpu_share = server_share((g.capacity for g in gpus),
                                               self._image_labels)
                if gpus:
                    names = ", ".join(g.label() for g in gpus)
                    self._report(15, f"Leased {names} for you")
                    if self._booked_note:
                        self._report(16, self._booked_note)
                self._resources = await self._within_the_machine(self._resources)
                await self._ensure_projects(settings)
                self.apply_settings(settings, self.gpu_uuids, self._gpu_share, self._resources)
                if self._job is not None:
                    self._report(19, f"A job: it runs {self._job.command[:80]!r} and stops "
                                     f"when that ends (~/jobs/{self.name}/)")
                self._report(20, f"Creating your container from {self.image}")
                try:
                    ip, port = await super().start()
                except docker.errors.APIError as e:
                    refusal = policy_refusal(e)
                    if refusal is None:
                        raise
                    self.log.error("Docker proxy refused %s's container: %s",
                                   self.log_name, refusal)
                    raise SpawnFailed(
                        f"The lab's Docker policy refused to create your server ({refusal}). "
                        f"This is a configuration problem: tell an admin.") from None
            finally:
                # The container now holds the lease in its labels, or the spawn failed.
                self.lease_book.settle(self.user.name, self.name)
            self._report(60, "Container started; waiting for JupyterLab to answer")
            await self._wait_until_ready(ip, port, deadline)
        except asyncio.CancelledError:
            # JupyterHub gave up (start_timeout). A Docker call may still be running on
            # DockerSpawner's single worker thread and create the container after this;
            # a removal queued behind it makes sure no container keeps the GPU label.
            self.gpu_uuids = []
            asyncio.ensure_future(self._remove_leftover())
            raise
        except Exception:
            self.gpu_uuids = []
            raise
        self._report(95, "Your server is ready")
        return ip, port

    # ------------------------------------------------------------- state

    def get_state(self):
        """DockerSpawner's state plus the leased GPUs, so that a server that outlives a
        hub restart still knows them (admins see them in the server's ``state``)."""
        state = super().get_state()
        if self.gpu_uuids:
            state["gpu_uuids"] = list(self.gpu_uuids)
        return state

    def load_state(self, state):
        super().load_state(state)
        self.gpu_uuids = list(state.get("gpu_uuids") or [])

    def clear_state(self):
        super().clear_state()
        self.gpu_uuids = []

    async def _remove_leftover(self) -> None:
        """Stop, then remove, the container of a start that was given up: JupyterHub
        gives a start up when it is stopped while still pending (a job cancelled before
        its server answered, seen under load). The stop's SIGTERM lets a job's runner say
        "stopped" in ~/jobs/ID/status; a removal alone (SIGKILL) left it "running"."""
        try:
            await self.docker("stop", self.object_name)
        except docker.errors.APIError:
            pass  # not made, or gone: the removal says what there is to say
        try:
            await self.docker("remove_container", self.object_name, force=True)
            self.log.info("Removed %s left by a start that was given up", self.object_name)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            self.log.warning("Could not remove %s after a given-up start: %s",
                             self.object_name, e)

    async def poll(self):
        """DockerSpawner's poll, and an exited container is removed when it is found:
        JupyterHub calls stop() only for servers that still run, and containers are not
        auto-removed (so that a crash's log can be shown), so nothing else would."""
        status = await super().poll()
        if status is not None and self.remove and self.container_id:
            await self.remove_object()
        return status

    async def stop(self, now=False):
        await super().stop(now=now)
        # With remove=True the container is gone, and its labels with it: released.
        self.lease_book.settle(self.user.name, self.name)
        self.gpu_uuids = []

    def run_post_stop_hook(self):
        """A stopped server's shares end (JupyterHub keeps them until the server is
        deleted): her colleague is not let into whatever she runs next. JupyterHub's
        User.stop runs this after every stop."""
        ended = shares.end_server_shares(self.user.db, self.orm_spawner)
        if ended:
            self.log.info("Ended %d share(s) of %s's stopped server %r", ended,
                          self.user.name, self.name)
        return super().run_post_stop_hook()

    async def _wait_until_ready(self, ip: str, port: int, deadline: float) -> None:
        url = f"http://{ip}:{port}{self.server.base_url}api"
        client = AsyncHTTPClient()
        while True:
            try:
                await client.fetch(HTTPRequest(url, request_timeout=2, follow_redirects=False))
                return
            except HTTPClientError as e:
                if e.code != 599:  # any HTTP answer means the server is listening
                    return
            except OSError:
                pass  # connection refused: not listening yet
            ended = await self._ended()
            if ended is not None:
                log_tail = await self._log_tail()
                await self.remove_object()  # JupyterHub won't stop() a dead server
                raise SpawnFailed(
                    f"Your server exited while starting ({ended}). "
                    f"Last lines of its log:\n{log_tail}"
                )
            if time.monotonic() > deadline:
                try:
                    log_tail = await asyncio.wait_for(self._log_tail(), 2)
                except TimeoutError:
                    log_tail = "(its log could not be read in time)"
                self.log.warning("%s did not answer within %ss; stopping it",
                                 self.log_name, self.start_timeout)
                # JupyterHub won't stop() a failed start: the container is removed (and
                # killed) after the message is out. Docker calls queue on DockerSpawner's
                # one worker thread: a stop and a removal took 8 s on a busy host (seen
                # in CI), past JupyterHub's own timeout, whose message is empty.
                asyncio.ensure_future(self._remove_leftover())
                raise SpawnFailed(
                    f"Your server did not answer within {self.start_timeout} seconds, so it "
                    f"was stopped. Try again; if it happens again, tell an admin (the "
                    f"image may be broken, or spawn.start_timeout too short). Last lines "
                    f"of its log:\n{log_tail}"
                )
            await asyncio.sleep(self.ready_poll_interval)

    async def _ended(self) -> str | None:
        """While starting: None while the server runs, else how it ended, in words."""
        if await super().poll() is None:
            return None
        try:
            state = (await self.docker("inspect_container", self.container_id))["State"]
        except docker.errors.NotFound:
            raise SpawnFailed("Your server's container disappeared while starting "
                              "(removed from outside the hub). Start it again.") from None
        return f"exit status {state['ExitCode']}"

    async def _log_tail(self, lines: int = 20) -> str:
        try:
            out = await self.docker("logs", self.container_id, tail=lines)
        except Exception as e:  # the container may already be gone
            return f"(log unavailable: {e})"
        return out.decode("utf-8", "replace").strip()
