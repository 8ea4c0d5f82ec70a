"""The line's REST API, under the hub's (``/hub/api/gpulab/line``).

* ``GET /hub/api/gpulab/line``: every entry, in line order, with its state and the GPUs
  it gets or waits for (admins, and the line service: unfiltered ``admin:servers``);
* ``GET /hub/api/gpulab/line/USER``: that member's entries and places (``read:servers``
  for her: herself, or an admin);
* ``DELETE /hub/api/gpulab/line/USER[/SERVER]``: she leaves the line (``servers``);
* ``PATCH /hub/api/gpulab/line/USER[/SERVER]`` ``{"offered": true}``: the line service
  is starting her server (``admin:servers``). ``false``: it could not, she waits again
  in her place. ``{"up": true}``: the server it started is up; her claim window runs
  from now (the first time only).

Members join by asking for a server with ``"wait": true`` (:mod:`gpulab.spawn.spawner`).
The hub's config puts what these handlers need in ``tornado_settings["gpulab-line"]``:
``{"file": the store, "gpus_file": gpus.yaml, "releases_file": the GPU culler's notices
(when each GPU is expected back), "bookings_file": members' bookings (their GPUs are
taken while they run), "swarm": bool}``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import needs_scope
from tornado import web

from gpulab import live_config
from gpulab import notices as notes
from gpulab.bookings.book import Booking
from gpulab.bookings.book import holds as booking_holds
from gpulab.bookings.store import booking_store
from gpulab.gpus.allocator import Lease
from gpulab.gpus.config import FAIR_SHARE
from gpulab.gpus.leases import LeaseBook, lease_book, swarm_lease_book
from gpulab.line.eta import Estimate, estimates
from gpulab.line.order import Standing, standing
from gpulab.line.plan import READY, WAITING, Place, plan
from gpulab.line.store import LineStore, line_store


def place_model(p: Place, waiting: int, eta: Estimate | None = None,
                standing: Standing | None = None) -> dict[str, Any]:
    e = p.entry
    return {"id": e.id, "user": e.user, "server": e.server, "gpus": e.gpus,
            "joined_at": e.joined_at, "offered_at": e.offered_at, "state": p.state,
            "ready_at": e.ready_at,  # OFFERED: when her server was up (None: not yet)
            "environment": e.environment,  # "": the lab's one
            "email": e.email,  # where she is told that her turn came ("": not by e-mail)
            # a job's options, which the line starts it with (None: a server)
            "job": json.loads(e.job) if e.job else None,
            "position": p.position, "waiting": waiting,
            "gpu_uuids": [g.uuid for g in p.gpus], "reason": p.reason,
            # when her turn is expected (None: nobody knows): "age" at the latest,
            # "idle" if the GPUs' holders stay idle, "booking" as a booking of them
            # starts or ends (gpulab.line.eta)
            "eta": eta.at if eta else None, "eta_kind": eta.kind if eta else "",
            # what places her (gpulab.line.order): her line_priority, and her recent
            # GPU-hours when the line is in fair share order (None otherwise)
            "priority": standing.priority if standing else 0,
            "gpu_hours": standing.gpu_hours if standing else None,
            "over_budget": standing.over_budget if standing else False,
            "max_wait_reached": standing.waited_out if standing else False}


def first_servers(entries) -> dict[str, str]:
    """Each member in line and the server she waits with, the first in line where she
    waits with several (her booking's GPUs go to that one)."""
    out: dict[str, str] = {}
    for e in entries:
        out.setdefault(e.user, e.server)
    return out


class LineAPIBase(APIHandler):
    @property
    def line_settings(self) -> dict[str, Any]:
        settings = self.settings.get("gpulab-line")
        if not settings:
            raise web.HTTPError(404, "This hub has no line for GPUs.")
        return settings

    @property
    def store(self) -> LineStore:
        return line_store(self.line_settings["file"])

    @property
    def book(self) -> LeaseBook:
        return swarm_lease_book() if self.line_settings.get("swarm") else lease_book()

    def bookings(self) -> list[Booking]:
        """Members' bookings (gpulab.bookings); none when the store cannot be read
        (logged)."""
        path = self.line_settings.get("bookings_file")
        if not path:
            return []
        try:
            return booking_store(path).bookings()
        except (OSError, sqlite3.Error) as e:
            self.log.error("The bookings' store %s cannot be read: %s", path, e)
            return []

    @staticmethod
    def booked(bookings, inventory, entries) -> list[Lease]:
        """The GPUs of the bookings running now: taken for everyone in line but their
        booker (for the server she waits with)."""
        return booking_holds(bookings, time.time(),
                             capacity={g.uuid: g.capacity for g in inventory},
                             waiting=first_servers(entries))

    async def write_places(self, user: str = "", server: str = "") -> None:
        """The line's models, or only *user*'s (her *server*'s), with how it is ordered:
        ``order`` (gpus.yaml's line.order) and ``by_use`` (false when fair share has no
        recent usage data and falls back to first come, first served)."""
        config = live_config.gpus_file.load(self.line_settings["gpus_file"])
        usage = self.store.usage()
        entries = self.store.entries()
        places: list[Place] = []
        etas: dict[int, Estimate] = {}
        if entries:
            inventory, servers = await self.book.snapshot(config)
            bookings = self.bookings()
            # a running booking's GPUs are taken for the plan; the estimates count the
            # bookings with their times instead
            leases = servers + self.booked(bookings, inventory, entries)
            places = plan(config, inventory, leases, entries, usage)
            releases = notes.read(self.line_settings["releases_file"]).releases
            etas = estimates(config, inventory, servers, places, releases, time.time(),
                             bookings)
        waiting = sum(p.state in (READY, WAITING) for p in places)
        self.write(json.dumps({
            "order": config.line.order,
            "by_use": config.line.order == FAIR_SHARE and usage.decayed is not None,
            "line": [place_model(p, waiting, etas.get(p.entry.id),
                                 standing(p.entry, config, usage)) for p in places
                     if (not user or p.entry.user == user)
                     and (not server or p.entry.server == server)]}))


class LineAPIHandler(LineAPIBase):
    @needs_scope("admin:servers")
    async def get(self):
        await self.write_places()


class MemberLineAPIHandler(LineAPIBase):
    @needs_scope("read:servers")
    async def get(self, user_name, server_name=""):
        await self.write_places(user_name, server_name)

    @needs_scope("servers")
    def delete(self, user_name, server_name=""):
        if not self.store.remove(user_name, server_name):
            raise web.HTTPError(404, f"{user_name}'s server {server_name!r} is not in line.")
        self.log.info("%s left the line (%s)", f"{user_name}:{server_name}".rstrip(":"),
                      f"{getattr(self.current_user, 'kind', 'user')} {self.current_user.name}")
        self.set_status(204)

    @needs_scope("admin:servers")
    def patch(self, user_name, server_name=""):
        body = self.get_json_body() or {}
        if body == {"up": True}:
            entry = self.store.server_up(user_name, server_name)
            if entry is None:
                raise web.HTTPError(404, f"{user_name}'s server {server_name!r} is not in "
                                         f"line with a server the line started.")
        elif set(body) == {"offered"} and isinstance(body["offered"], bool):
            entry = self.store.offer(user_name, server_name, body["offered"])
            if entry is None:
                raise web.HTTPError(404, f"{user_name}'s server {server_name!r} is not in line.")
        else:
            raise web.HTTPError(400, 'The only changes are {"offered": true or false} and '
                                     '{"up": true}.')
        self.write(json.dumps({"id": entry.id, "offered_at": entry.offered_at,
                               "ready_at": entry.ready_at}))


def api_handlers() -> list[tuple[str, type]]:
    return [
        (r"/api/gpulab/line", LineAPIHandler),
        (r"/api/gpulab/line/([^/]+)", MemberLineAPIHandler),
        (r"/api/gpulab/line/([^/]+)/([^/]+)", MemberLineAPIHandler),
    ]
