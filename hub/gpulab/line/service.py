"""The line service: when it is a waiting member's turn, start her server; if she does
not open it within the claim window, stop it so that the next member gets the GPUs.

A hub service like the GPU culler: it asks the hub's REST API (:mod:`gpulab.line.api`,
through :class:`gpulab.hubapi.HubApi`) who is where in line, and acts through it. What
it may do is its role's (``hubconfig.LINE_SCOPES``): start, look at and stop servers,
and read the groups' members (for budgets a group shares).
Which GPUs a member gets stays the spawner's decision: the hub keeps them for her from
the moment her turn comes (:func:`gpulab.line.plan.holds`), so nobody takes them between
two of this service's rounds.

What it decides is :func:`decide`'s, a pure function of what the hub answered.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpulab import live_config
from gpulab import notices as notes
from gpulab.contract import scrape_seconds
from gpulab.gpu_hours import average_held_query, gpu_hours_query
from gpulab.gpus.budget import budget_periods, period_start
from gpulab.gpus.config import FAIR_SHARE, GpusConfig
from gpulab.hubapi import HubApi, HubApiError, hub_time
from gpulab.line import usage as line_usage
from gpulab.line.plan import OFFERED, READY, REFUSED
from gpulab.mail import MailSettings
from gpulab.prometheus_api import Prometheus, PrometheusUnavailable
from gpulab.settings import duration_text
from gpulab.yamlfile import ConfigError

log = logging.getLogger("gpulab.line")

START = "start"  # her turn: open the claim window, start her server
CLAIMED = "claimed"  # she opened it: out of the line, the server is hers
EXPIRED = "expired"  # not opened within the claim window: stopped, next member's turn
GONE = "gone"  # her server stopped (or failed to start) before she opened it
REFUSE = "refuse"  # her request can no longer be met
WAIT = "wait"

# Activity later than this after her server became ready is hers: the proxy records a
# route's first activity when the hub adds the route, as the server becomes ready.
CLAIM_MARGIN = 5.0


@dataclass(frozen=True)
class Decision:
    action: str
    user: str
    server: str
    gpus: int = 0
    message: str = ""  # for her (a notice) and the log
    environment: str = ""  # START: the environment to start her server in ("": the lab's)
    email: str = ""  # START: where she is told that her turn came ("": not by e-mail)
    job: Any = None  # START: the job's options to start it with (None: a server)


def decide(entry: Mapping[str, Any], server: Mapping[str, Any] | None, now: float,
           claim_window: float, ready_at: float | None) -> Decision:
    """What to do about one entry of the line (the line API's model), given her server's
    model from the hub (None: not running), when that server was first seen up
    (*ready_at*, None: not yet). Her claim window runs from then: she cannot open it
    before, however long it took to start."""
    user, name, gpus = entry["user"], entry["server"], entry["gpus"]
    state = entry["state"]
    if state == REFUSED:
        return Decision(REFUSE, user, name, gpus, entry.get("reason") or "")
    if state == READY:
        return Decision(START, user, name, gpus, environment=entry.get("environment") or "",
                        email=entry.get("email") or "", job=entry.get("job"))
    if state != OFFERED:
        return Decision(WAIT, user, name, gpus)
    if server is None or not (server.get("ready") or server.get("pending")):
        if entry.get("job"):  # it ran and ended (a short job may, between two looks):
            return Decision(GONE, user, name, gpus)  # its own notice says how
        if ready_at is None:
            return Decision(GONE, user, name, gpus,
                            "it could not be started when it was your turn in line")
        return Decision(GONE, user, name, gpus)  # she (or an admin) stopped it
    if not server.get("ready") or ready_at is None:
        return Decision(WAIT, user, name, gpus)
    if entry.get("job"):  # a job runs unattended: nobody opens it
        return Decision(CLAIMED, user, name, gpus)
    if hub_time(server.get("last_activity")) > ready_at + CLAIM_MARGIN:
        return Decision(CLAIMED, user, name, gpus)
    if now >= ready_at + claim_window:
        return Decision(EXPIRED, user, name, gpus,
                        f"it was started for you when GPUs came free, and you did not "
                        f"open it within {duration_text(int(claim_window))}, so its GPUs "
                        f"went to the next member waiting")
    return Decision(WAIT, user, name, gpus)


class LineService:
    def __init__(self, hub: HubApi, gpus_file: str, notices_file: str,
                 interval: float = 5.0, prometheus: Prometheus | None = None,
                 usage_file: str | None = None, mail: MailSettings | None = None):
        self.hub = hub
        self.mail = mail  # how to e-mail a member whose turn came (None: no e-mail)
        self.mailing: set[asyncio.Task] = set()  # e-mails being sent
        self.gpus_file = gpus_file
        self.notices_file = notices_file
        self.interval = interval
        self.prometheus = prometheus  # members' recent GPU-hours, for fair share
        self.usage_file = usage_file
        self.usage_at = -math.inf  # when they were last asked for
        self.groups: dict[str, list[str]] = {}  # the hub's groups' members, last read

    async def check(self, now: float | None = None) -> list[Decision]:
        """One round: the decisions taken."""
        now = time.time() if now is None else now
        config = live_config.gpus_file.load(self.gpus_file)
        await self.refresh_usage(config, now)
        entries = await self.hub.line()
        window = config.line.claim_window
        taken = []
        for entry in entries:
            server, ready_at = None, entry.get("ready_at")
            if entry["state"] == OFFERED:
                model = await self.hub.user(entry["user"])
                server = ((model or {}).get("servers") or {}).get(entry["server"])
                if server and server.get("ready") and ready_at is None:
                    # up: the hub notes when, and her claim window runs from then
                    ready_at = await self.hub.server_up(entry["user"], entry["server"])
            d = decide(entry, server, now, window, ready_at)
            if d.action != WAIT:
                await self.apply(d, window)
                taken.append(d)
        return taken

    async def refresh_usage(self, config: GpusConfig, now: float) -> None:
        """Members' GPU-hours from Prometheus, into the usage file the hub orders the line
        by and checks budgets with: the decayed ones under fair share, this week's or
        month's where a budget counts them. Once a minute (more often for a half-life
        under 100 minutes). When Prometheus does not answer, the file grows old and the
        hub falls back to first come, first served, with no budget enforced."""
        fair = config.line.order == FAIR_SHARE
        periods = budget_periods(config)
        if self.prometheus is None or not self.usage_file or not (fair or periods):
            return
        half_life = config.line.half_life
        if now - self.usage_at < min(60.0, max(self.interval, half_life / 100)):
            return
        try:
            decayed = None
            if fair:
                window, step = line_usage.window_and_step(half_life, scrape_seconds())
                matrix = await self.prometheus.query_range(average_held_query(step),
                                                           now - window, now, step)
                decayed = line_usage.decayed_gpu_hours(line_usage.by_user(matrix), now,
                                                       half_life, step)
            spent = {}
            for per in sorted(periods):
                since = max(1, int(now - period_start(now, per)))
                vector = await self.prometheus.query(gpu_hours_query(since), now)
                spent[per] = {s["metric"].get("user", ""): float(s["value"][1])
                              for s in vector}
        except PrometheusUnavailable as e:
            log.warning("line: members' GPU-hours not updated (%s); after %d s the line is "
                        "first come, first served and no budget is enforced", e,
                        line_usage.MAX_AGE)
            return
        if periods:  # for shared budgets, and budget use per group in Prometheus
            try:
                self.groups = {g["name"]: g.get("users") or []
                               for g in await self.hub.groups()}
            except HubApiError as e:
                log.warning("line: the groups' members not read (%s); the last ones read "
                            "(%d groups) still count for shared budgets", e, len(self.groups))
        self.usage_at = now
        line_usage.write(self.usage_file, now, decayed, spent, self.groups)

    async def apply(self, d: Decision, claim_window: int) -> None:
        who = f"{d.user}:{d.server}" if d.server else d.user
        if d.action == START:
            offered_at = await self.hub.offer(d.user, d.server)
            options = {"gpus": d.gpus, **({"environment": d.environment}
                                          if d.environment else {}),
                       # a job mails her how it ended, too (gpulab.spawn.servers_api)
                       **({"job": d.job} if d.job else {}),
                       **({"email": d.email} if d.job and d.email else {})}
            status, body = await self.hub.start_server(d.user, d.server, options)
            reason = (body or {}).get("message") if isinstance(body, dict) else ""
            if status == 409:  # the GPUs went in between (a race): she keeps her place
                log.info("line: %s's turn, but not now (%s); next round", who, reason)
                await self.hub.offer(d.user, d.server, offered=False)
            elif status >= 400:
                log.warning("line: %s's turn, but the hub did not start it (%s): %s",
                            who, status, reason)
                await self.hub.leave_line(d.user, d.server)
                self.notify(d, f"it could not be started when it was your turn in line "
                               f"({reason or status})")
            else:
                log.info("line: %s's turn: starting it with %d GPU(s)%s", who, d.gpus,
                         f" in {d.environment}" if d.environment else "")
                if d.email and self.mail is not None:
                    # beside the rounds: an SMTP server that is slow to answer holds up
                    # nobody's turn
                    task = asyncio.create_task(self.mail.tell_turn(
                        d.email, d.user, d.server, d.gpus, claim_window,
                        offered_at or time.time()))
                    self.mailing.add(task)
                    task.add_done_callback(self.mailing.discard)
            return
        if d.message:  # told first: whoever sees her place gone finds why beside it
            self.notify(d, d.message)
        if d.action == EXPIRED:
            await self.hub.stop_server(d.user, d.server)
        await self.hub.leave_line(d.user, d.server)
        log.info("line: %s %s%s", who, d.action, f": {d.message}" if d.message else "")

    def notify(self, d: Decision, message: str) -> None:
        notes.record_stopped(self.notices_file, notes.Stopped(
            d.user, d.server, time.time(), notes.LINE, message))

    async def run(self) -> None:
        log.info("line: checking every %s s; GPUs from %s", self.interval, self.gpus_file)
        while True:
            try:
                await self.check()
            except (HubApiError, ConfigError) as e:
                log.warning("line: this round did nothing: %s", e)
            except Exception:  # one bad round must not end the service
                log.exception("line: the round failed")
            await asyncio.sleep(self.interval)
