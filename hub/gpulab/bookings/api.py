"""Bookings through the hub's REST API (``/hub/api/gpulab/bookings``) and its page
(``/hub/bookings``).

* ``GET /hub/api/gpulab/bookings``: the lab's calendar: every booking not ended, with the
  GPUs it keeps and when; other members' names only for admins (unfiltered
  ``admin:servers``); the limits and the GPUs (any signed-in member);
* ``GET /hub/api/gpulab/bookings/USER``: her bookings (``read:servers`` for her);
* ``POST /hub/api/gpulab/bookings/USER`` ``{"gpus": 1, "start": "2027-01-11T09:00:00Z",
  "end": "2027-01-11T13:00:00+00:00"}``: book (``servers`` for her: herself or an admin);
  201 with the booking, or 400, 403 or 409 saying why not (nothing is recorded);
* ``DELETE /hub/api/gpulab/bookings/USER/ID``: cancel (``servers`` for her).

The hub's config puts what these handlers need in ``tornado_settings["gpulab-bookings"]``:
``{"file": the store, "gpus_file": gpus.yaml, "settings_file": gpulab.yaml, "usage": a
callable -> the members' GPU-hours the line service brought
(:class:`gpulab.line.usage.Usage`; handed in so that bookings import no line), "swarm":
bool}``.
"""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime
from typing import Any

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.scopes import needs_scope
from tornado import web

from gpulab import live_config
from gpulab.bookings.book import Booking, BookingRefused
from gpulab.bookings.store import BookingStore, booking_store
from gpulab.contract import shared_home
from gpulab.gpus.allocator import Gpu
from gpulab.gpus.leases import LeaseBook, lease_book, swarm_lease_book
from gpulab.gpus.policy import policy_for
from gpulab.settings import duration_text

KEYS = ("gpus", "start", "end")
# Times a booking can have at all (later checks say "in the past" or "too far ahead"):
# 1970 to 9998, so that every time can be printed back in UTC.
EARLIEST, LATEST = 0.0, datetime(9998, 12, 31, tzinfo=UTC).timestamp()


def parse_time(value: Any, what: str) -> float:
    """An ISO 8601 time with its time zone, as epoch seconds; ValueError saying what is
    wrong otherwise."""
    if not isinstance(value, str):
        raise ValueError(f"\"{what}\" must be a time such as 2027-01-11T09:00:00Z, got "
                         f"{value!r}")
    try:
        t = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(f"\"{what}\" is not a time: {value!r} (for example "
                         f"2027-01-11T09:00:00Z)") from None
    if t.tzinfo is None:
        raise ValueError(f"\"{what}\" needs its time zone, for example "
                         f"{value.strip()}Z for UTC or {value.strip()}+01:00")
    seconds = t.timestamp()
    if not (math.isfinite(seconds) and EARLIEST <= seconds <= LATEST):
        raise ValueError(f"\"{what}\" is not a time a booking can have: {value!r}")
    return seconds


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def booking_model(b: Booking, gpus: dict[str, Gpu], viewer: str, sees_names: bool,
                  now: float) -> dict[str, Any]:
    """One booking as the API shows it to *viewer*: other members' names (and who made
    it) only to admins."""
    mine = b.user == viewer
    return {"id": b.id, "user": b.user if mine or sees_names else None, "mine": mine,
            "gpus": len(b.gpus),
            "gpu_labels": [gpus[u].label() if u in gpus else u for u in b.gpus],
            "start": iso(b.start), "end": iso(b.end), "running": b.runs_at(now),
            "made_by": b.made_by if mine or sees_names else None}


class BookingsBase(APIHandler):
    @property
    def bookings_settings(self) -> dict[str, Any]:
        settings = self.settings.get("gpulab-bookings")
        if not settings:
            raise web.HTTPError(404, "This hub takes no bookings.")
        return settings

    @property
    def store(self) -> BookingStore:
        return booking_store(self.bookings_settings["file"])

    @property
    def book(self) -> LeaseBook:
        return swarm_lease_book() if self.bookings_settings.get("swarm") else lease_book()

    def config(self):
        return live_config.gpus_file.load(self.bookings_settings["gpus_file"])

    async def gpus(self, config) -> dict[str, Gpu]:
        return {g.uuid: g for g in await self.book.current_inventory(config)}

    def viewer(self) -> tuple[str, bool]:
        """(who asks, whether she sees every member's name: an admin)."""
        return self.current_user.name, self.has_scope("admin:servers")

    def write_bookings(self, bookings: list[Booking], inventory: dict[str, Gpu],
                       **extra: Any) -> None:
        name, admin = self.viewer()
        now = time.time()
        self.write(json.dumps({**extra, "bookings": [
            booking_model(b, inventory, name, admin, now) for b in bookings if b.end > now]}))


class BookingsAPIHandler(BookingsBase):
    @needs_scope("read:servers", post_filter=True)  # any member holds it for herself
    async def get(self):
        config = self.config()
        gpus = await self.gpus(config)
        limits = config.bookings
        self.write_bookings(self.store.bookings(), gpus, limits={
            "max_length": limits.max_length, "max_ahead": limits.max_ahead,
            "max_gpus": limits.max_gpus,
            "text": (f"A booking lasts at most {duration_text(limits.max_length)} and starts "
                     f"at most {duration_text(limits.max_ahead)} ahead."
                     if limits.max_length else "This lab takes no bookings.")},
            gpus=[{"uuid": g.uuid, "label": g.label()}
                  for g in sorted(gpus.values(), key=lambda g: (g.machine, g.index))])


class MemberBookingsAPIHandler(BookingsBase):
    @needs_scope("read:servers")
    async def get(self, user_name):
        self.write_bookings(self.store.bookings(user_name),
                            await self.gpus(self.config()))

    @needs_scope("servers")
    async def post(self, user_name):
        user = self.find_user(user_name)
        if user is None:
            raise web.HTTPError(404, f"No user {user_name}.")
        body = self.get_json_body() or {}
        if not isinstance(body, dict) or set(body) != set(KEYS):
            raise web.HTTPError(400, 'A booking is {"gpus": N, "start": TIME, "end": TIME}, '
                                     'times in ISO 8601 with their time zone (for example '
                                     '2027-01-11T09:00:00Z); got keys '
                                     f'{sorted(body) if isinstance(body, dict) else body!r}.')
        try:
            start = parse_time(body["start"], "start")
            end = parse_time(body["end"], "end")
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None
        config = self.config()
        groups = [g.name for g in user.groups]
        inventory, leases = await self.book.snapshot(config)
        used, sharing = self.budget_use(config, user.name, groups)
        try:
            booking = self.store.make(config, inventory, user.name, groups, body["gpus"],
                                      start, end, self.current_user.name, used, leases,
                                      self.home_machine(user), sharing)
        except BookingRefused as e:
            self.log.info("Booking by %s for %s refused: %s", self.current_user.name,
                          user.name, e)
            raise web.HTTPError(e.status, str(e)) from None
        self.log.info("%s booked %d GPU(s) for %s from %s to %s (%s)", self.current_user.name,
                      len(booking.gpus), user.name, iso(start), iso(end),
                      ", ".join(booking.gpus))
        name, admin = self.viewer()
        self.set_status(201)
        self.write(json.dumps(booking_model(booking, {g.uuid: g for g in inventory}, name,
                                            admin, time.time())))

    def home_machine(self, user) -> str:
        """On a Swarm whose homes are on one machine, the node of her home: her servers
        run there, so her booking's GPUs must be there ("": anywhere; also before her
        first start, when her home is not made yet)."""
        if not self.bookings_settings.get("swarm"):
            return ""
        settings = live_config.settings_file.load(self.bookings_settings["settings_file"])
        if settings["spawn.swarm_homes"] != "machine":
            return ""
        states = {name: orm.state for name, orm in user.orm_user.orm_spawners.items()}
        return shared_home(states, None)[0]

    def budget_use(self, config, user: str, groups: list[str]
                   ) -> tuple[float | None, tuple[str, ...]]:
        """The GPU-hours counted against her budget this period (None: no budget, or not
        known), and who shares it (her group's members, for a shared one)."""
        policy = policy_for(config, user, groups)
        if policy.budget is None:
            return None, ()
        usage = self.bookings_settings["usage"]()
        return (usage.used_against(policy.budget, user, config),
                usage.sharing(policy.budget, user, config))


class MemberBookingAPIHandler(BookingsBase):
    @needs_scope("servers")
    def delete(self, user_name, booking_id):
        booking = self.store.cancel(user_name, int(booking_id))
        if booking is None:
            raise web.HTTPError(404, f"{user_name} has no booking {booking_id}.")
        self.log.info("%s cancelled %s's booking %s (%s to %s)", self.current_user.name,
                      user_name, booking_id, iso(booking.start), iso(booking.end))
        self.set_status(204)


class BookingsPageHandler(BaseHandler):
    """``/hub/bookings``: the lab's calendar of bookings, and her form to book; the page
    works through the REST API above (with the page's XSRF token)."""

    @web.authenticated
    async def get(self):
        user = self.current_user
        html = await self.render_template("bookings.html", user=user,
                                          for_user=self.get_argument("user", user.name))
        self.finish(html)


def api_handlers() -> list[tuple[str, type]]:
    return [
        (r"/api/gpulab/bookings", BookingsAPIHandler),
        (r"/api/gpulab/bookings/([^/]+)", MemberBookingsAPIHandler),
        (r"/api/gpulab/bookings/([^/]+)/([0-9]{1,18})", MemberBookingAPIHandler),
        (r"/bookings", BookingsPageHandler),
    ]
