"""A simulated month of a lab with fewer GPUs than members: how long members
wait, how many GPU-hours sit idle while someone waits, and how fairly the GPUs go round,
under today's retry-on-409 against the line's two orders, side by side in one run.

No Docker, no hub, no sleeping: simulated time. Each policy meets the same members asking
the same things (each member's asks are drawn from her own seeded stream), and every
decision is made by gpulab's own code, as the hub makes it:

* a spawn gets GPUs only if :func:`gpulab.gpus.allocator.allocate` gives them, counting the
  GPUs the line keeps (:func:`gpulab.line.plan.holds`), as the spawner does;
* the line's turn (:func:`gpulab.line.plan.plan`) in its order (:mod:`gpulab.line.order`:
  ``first_come`` or ``fair_share`` from the parsed ``config/gpus.yaml`` text below), with
  members' decayed GPU-hours computed by :func:`gpulab.line.usage.decayed_gpu_hours` from
  step samples, as the line service computes them from Prometheus, refreshed every
  ``--usage-every`` simulated seconds;
* the claim window: the server the line starts for her is hers if she opens it in time,
  and stopped (its GPUs to the next) if not.

The members (``--members``, default 30) are heavy, regular and light users (a fifth, a
half and the rest). Each works in a loop: she thinks (an exponential pause), then asks for
a server with 1 GPU (heavy users: 2 GPUs three times in ten) for a session (log-normal
length), and gives up after her patience runs out. Asks fall in working hours (Monday to
Friday, 08:00-20:00); one that would fall outside is made at the next working morning,
when everyone comes in: that is when GPUs are short. Under retry-on-409 she asks again
every few minutes (exponential, mean ``--retry-every``); in line, she joins it once. One
server the line starts in ten is not opened within the claim window (she has gone); the
others are opened after a short delay. Under retry-on-409 the same ask is simply served
at her next try (she is there when she tries): that favours the baseline.

Figures, per policy: asks served and given up, mean and 95th-percentile wait of the asks
served (from asking until the GPUs were hers: her server started), the mean wait of light
and heavy members, GPU-hours left idle while someone waited for GPUs she could use (the
line's goal: 0), GPU-hours held by servers the line started that nobody opened, the GPUs'
utilization (GPU-hours held by sessions over the lab's GPU-hours), and Jain's fairness
index over members of the share of their asked GPU-hours that they got (1: all alike).
Ratios are against retry-on-409, the baseline. The seconds of real time each policy took
and the mean time of one :func:`~gpulab.line.plan.plan` are printed too.

    python -m bench.scarcity                      # 30 members, 8 GPUs, 30 days, seed 1
    python -m bench.scarcity --seed 7 --gpus 6 --days 14
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from gpulab.gpus.allocator import (
    Gpu,
    Lease,
    NotEnoughGpus,
    Request,
    add_leases,
    allocate,
    release,
)
from gpulab.gpus.config import GpusConfig, parse_gpus_config
from gpulab.line.order import Entry
from gpulab.line.plan import READY, REFUSED, WAITING, Place, holds, plan
from gpulab.line.usage import Usage, decayed_gpu_hours, window_and_step

HOUR = 3600.0
DAY = 24 * HOUR
START = datetime(2027, 2, 1, tzinfo=UTC).timestamp()  # a Monday, 00:00 UTC
WORK_FROM, WORK_UNTIL = 8, 20  # working hours, Monday to Friday

RETRY = "retry on 409"
FIRST_COME = "first come"
FAIR_SHARE = "fair share"
POLICIES = (RETRY, FIRST_COME, FAIR_SHARE)


# ---------------------------------------------------------------- the lab's members


@dataclass(frozen=True)
class Kind:
    name: str
    think_hours: float  # mean pause between the end of one ask and the next
    session_hours: float  # median session length (log-normal, sigma 0.6)
    two_gpus: float  # chance that an ask is for 2 GPUs
    patience_hours: float  # mean time she waits before she gives up (exponential)


HEAVY = Kind("heavy", think_hours=1.0, session_hours=4.0, two_gpus=0.3, patience_hours=6.0)
REGULAR = Kind("regular", think_hours=4.0, session_hours=2.0, two_gpus=0.0, patience_hours=3.0)
LIGHT = Kind("light", think_hours=24.0, session_hours=1.0, two_gpus=0.0, patience_hours=1.5)


@dataclass(frozen=True)
class Ask:
    think: float  # seconds after her previous ask ended
    gpus: int
    session: float  # seconds she works once the GPUs are hers
    patience: float  # seconds she waits at most
    opens_after: float | None  # seconds until she opens a server the line started; None: never


def kinds(members: int) -> list[Kind]:
    heavy, regular = round(members / 5), round(members / 2)
    return [HEAVY] * heavy + [REGULAR] * regular + [LIGHT] * (members - heavy - regular)


def asks(seed: int, member: str, kind: Kind) -> Iterator[Ask]:
    """Her asks, one after another, the same under every policy."""
    rng = random.Random(f"{seed}:{member}")
    while True:
        yield Ask(think=rng.expovariate(1 / (kind.think_hours * HOUR)),
                  gpus=2 if rng.random() < kind.two_gpus else 1,
                  session=kind.session_hours * HOUR * math.exp(rng.gauss(0, 0.6)),
                  patience=rng.expovariate(1 / (kind.patience_hours * HOUR)),
                  opens_after=None if rng.random() < 0.1 else rng.expovariate(1 / 120))


def working_time(t: float, rng: random.Random) -> float:
    """*t* if it is in working hours, else a time in the first two working hours of the
    next working day."""
    day = datetime.fromtimestamp(t, UTC)
    if day.weekday() < 5 and WORK_FROM <= day.hour < WORK_UNTIL:
        return t
    morning = day.replace(hour=WORK_FROM, minute=0, second=0, microsecond=0)
    if day.hour >= WORK_FROM:
        morning += timedelta(days=1)
    while morning.weekday() >= 5:
        morning += timedelta(days=1)
    return morning.timestamp() + rng.uniform(0, 2 * HOUR)


# ---------------------------------------------------------------- figures


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one has everything."""
    if not values or not any(values):
        return 1.0
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass
class Result:
    policy: str
    asked: int = 0  # asks made
    served: int = 0  # asks whose GPUs became hers
    gave_up: int = 0  # asks she gave up waiting on
    not_opened: int = 0  # of those served, servers the line started that she did not open
    waits: list[float] = field(default_factory=list)  # seconds, per ask served
    # seconds from asking until served or given up, per ask that ended either way
    ended: list[float] = field(default_factory=list)
    waits_by_kind: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    idle_while_waiting: float = 0.0  # GPU-seconds
    unopened: float = 0.0  # GPU-seconds held by servers the line started, not opened
    in_sessions: float = 0.0  # GPU-seconds held by sessions
    asked_gpu_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    got_gpu_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    plans: int = 0
    plan_seconds: float = 0.0
    seconds: float = 0.0  # real time the simulation took

    def fairness(self, members: Sequence[str]) -> float:
        return jain([self.got_gpu_seconds[m] / self.asked_gpu_seconds[m]
                     for m in members if self.asked_gpu_seconds[m]])


# ---------------------------------------------------------------- the simulation


@dataclass
class Member:
    name: str
    kind: Kind
    stream: Iterator[Ask]
    ask: Ask | None = None
    asked_at: float = 0.0
    state: str = "thinking"  # thinking, waiting, offered, working
    attempt: int = 0  # bumped on every change, so that stale events are ignored


class Lab:
    """One policy's month. Events are (time, order, kind, member, attempt)."""

    def __init__(self, policy: str, config: GpusConfig, inventory: Sequence[Gpu],
                 members: Sequence[tuple[str, Kind]], seed: int, until: float,
                 retry_every: float, usage_every: float,
                 streams: Mapping[str, Iterator[Ask]] | None = None):
        """*streams*: each member's asks (default: drawn from *seed* and her kind)."""
        self.policy, self.config, self.inventory = policy, config, list(inventory)
        self.until, self.retry_every, self.usage_every = until, retry_every, usage_every
        streams = streams or {name: asks(seed, name, kind) for name, kind in members}
        self.members = {name: Member(name, kind, streams[name]) for name, kind in members}
        self.rng = random.Random(f"{seed}:{policy}:retries")
        self.leases: list[Lease] = []
        self.line: dict[str, Entry] = {}  # member -> her entry
        self.entry_ids = 0
        self.events: list[tuple[float, int, str, str, int]] = []
        self.counter = 0
        self.now = START
        self.result = Result(policy)
        # fair share's inputs: per member, GPUs held per step (as Prometheus' recording
        # rule averages them), and the intervals still open
        self.window, self.step = window_and_step(config.line.half_life, 60)
        self.samples: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        self.holding: dict[str, tuple[float, int]] = {}  # member -> (since, GPUs)
        self.usage = Usage(None, {}, None)
        self.usage_at = -math.inf

    # -------------------------------------------------------- events

    def at(self, t: float, kind: str, m: Member) -> None:
        self.counter += 1
        heapq.heappush(self.events, (t, self.counter, kind, m.name, m.attempt))

    def run(self) -> Result:
        started = time.perf_counter()
        for m in self.members.values():
            self.next_ask(m, START)
        while self.events and self.events[0][0] < self.until:
            t, _, kind, name, attempt = heapq.heappop(self.events)
            m = self.members[name]
            if attempt != m.attempt:
                continue  # overtaken (she was served, gave up, ...)
            self.advance(t)
            getattr(self, f"on_{kind}")(m)
            if self.policy != RETRY:
                self.serve_line()
        self.advance(self.until)
        self.result.seconds = time.perf_counter() - started
        return self.result

    def advance(self, t: float) -> None:
        """Count the GPU-seconds of the time since the last event, as things stood."""
        span = t - self.now
        if span > 0:
            held = Counter(le.gpu_uuid for le in self.leases)
            free = sum(1 for g in self.inventory if not held.get(g.uuid))
            wanted = sum(m.ask.gpus for m in self.members.values() if m.state == "waiting")
            self.result.idle_while_waiting += span * min(free, wanted)
            for m in self.members.values():
                gpus = sum(1 for le in self.leases if le.user == m.name)
                if m.state == "offered":
                    self.result.unopened += span * gpus
                elif m.state == "working":
                    self.result.in_sessions += span * gpus
        self.now = t

    def next_ask(self, m: Member, after: float) -> None:
        m.ask = next(m.stream)
        m.state, m.attempt = "thinking", m.attempt + 1
        self.at(working_time(after + m.ask.think, self.mornings(m)), "ask", m)

    def mornings(self, m: Member) -> random.Random:
        """Where the time of *m*'s ask on a working morning is drawn from: here the
        policy's one stream, in the order of events."""
        return self.rng

    def on_ask(self, m: Member) -> None:
        self.result.asked += 1
        self.result.asked_gpu_seconds[m.name] += m.ask.gpus * m.ask.session
        m.asked_at, m.state = self.now, "waiting"
        self.at(self.now + m.ask.patience, "give_up", m)
        self.try_spawn(m)

    def on_retry(self, m: Member) -> None:
        self.try_spawn(m)

    def try_spawn(self, m: Member) -> None:
        """Her spawn, as the spawner makes it: the GPUs the line keeps count as taken."""
        request = Request(m.name, "", (), m.ask.gpus)
        taken = self.leases
        if self.policy != RETRY and self.line:
            taken = taken + holds(self.places(), self.leases, spawning=(m.name, ""))
        try:
            gpus = allocate(self.config, self.inventory, taken, request)
        except NotEnoughGpus:
            if self.policy == RETRY:
                self.at(self.now + self.rng.expovariate(1 / self.retry_every), "retry", m)
            else:
                self.entry_ids += 1
                self.line[m.name] = Entry(self.entry_ids, m.name, "", m.ask.gpus, self.now)
            return
        self.take(m, gpus)
        self.start_session(m)

    def take(self, m: Member, gpus: Sequence[Gpu]) -> None:
        self.leases = add_leases(self.leases, Request(m.name, "", (), m.ask.gpus), gpus,
                                 datetime.fromtimestamp(self.now, UTC))
        self.holding[m.name] = (self.now, len(gpus))
        self.result.served += 1
        wait = self.now - m.asked_at
        self.result.waits.append(wait)
        self.result.ended.append(wait)
        self.result.waits_by_kind[m.kind.name].append(wait)

    def start_session(self, m: Member) -> None:
        m.state, m.attempt = "working", m.attempt + 1
        self.result.got_gpu_seconds[m.name] += m.ask.gpus * m.ask.session
        self.at(self.now + m.ask.session, "end", m)

    def drop(self, m: Member) -> None:
        """Her server stops: its GPUs are free, her step samples recorded."""
        self.leases = release(self.leases, m.name, "")
        since, gpus = self.holding.pop(m.name)
        for k, held in steps(since, gpus, self.step, until=self.now):
            self.samples[m.name][k] += held

    def on_end(self, m: Member) -> None:
        self.drop(m)
        self.next_ask(m, self.now)

    def on_give_up(self, m: Member) -> None:
        self.result.gave_up += 1
        self.result.ended.append(self.now - m.asked_at)
        self.line.pop(m.name, None)
        self.next_ask(m, self.now)

    def on_open(self, m: Member) -> None:
        del self.line[m.name]  # claimed: out of the line, the server is hers
        self.start_session(m)

    def on_claim_window_ends(self, m: Member) -> None:
        del self.line[m.name]
        self.drop(m)  # stopped: its GPUs go to the next
        self.result.not_opened += 1
        self.next_ask(m, self.now)

    # -------------------------------------------------------- the line

    def places(self):
        self.refresh_usage()
        started = time.perf_counter()
        places = plan(self.config, self.inventory, self.leases, self.line.values(), self.usage)
        self.result.plans += 1
        self.result.plan_seconds += time.perf_counter() - started
        return places

    def serve_line(self) -> None:
        """What the line service does each round: start the server of each member whose
        turn it is (READY), with the GPUs the plan gives her."""
        if not any(e.offered_at is None for e in self.line.values()):
            return
        for place in self.places():
            m = self.members[place.entry.user]
            if place.state == READY:
                self.offer(m, place)
            elif place.state == REFUSED:
                raise AssertionError(f"the line refused {m.name}: {place.reason}")
            else:
                assert place.state == WAITING or place.entry.offered_at is not None

    def offer(self, m: Member, place: Place) -> None:
        """Her turn: the line starts her server with the GPUs of her *place*; it is hers
        if she opens it within the claim window."""
        self.take(m, place.gpus)
        self.line[m.name] = replace(place.entry, offered_at=self.now)
        m.state, m.attempt = "offered", m.attempt + 1
        if m.ask.opens_after is not None and m.ask.opens_after < self.config.line.claim_window:
            self.at(self.now + m.ask.opens_after, "open", m)
        else:
            self.at(self.now + self.config.line.claim_window, "claim_window_ends", m)

    def refresh_usage(self) -> None:
        """Members' decayed GPU-hours, as the line service brings them from Prometheus
        (step samples over four half-lives) every usage_every seconds."""
        if self.config.line.order != "fair_share" or self.now - self.usage_at < self.usage_every:
            return
        self.usage_at = self.now
        first = int((self.now - self.window) // self.step)
        series = {}
        for name in self.members:
            held = dict(self.samples[name])
            if name in self.holding:  # the open interval, up to now
                for k, v in steps(*self.holding[name], self.step, until=self.now):
                    held[k] = held.get(k, 0.0) + v
            series[name] = [((k + 1) * self.step, v) for k, v in held.items() if k >= first]
        decayed = decayed_gpu_hours(series, self.now, self.config.line.half_life, self.step)
        self.usage = Usage(decayed, {}, self.now)


def steps(since: float, gpus: int, step: float, until: float) -> Iterator[tuple[int, float]]:
    """*gpus* held from *since* to *until* as (step number, GPUs held on average over that
    step): what Prometheus' recording rule of the GPUs each member holds samples."""
    k = int(since // step)
    while k * step < until:
        yield k, gpus * (min(until, (k + 1) * step) - max(since, k * step)) / step
        k += 1


# ---------------------------------------------------------------- the lab's config


def lab_config(gpus: int, order: str, claim_window: str) -> tuple[GpusConfig, list[Gpu]]:
    """gpus.yaml as an admin writes it (parsed by gpulab's own parser), and its GPUs."""
    text = ("inventory:\n" + "".join(
                f"  - {{index: {i}, uuid: GPU-{i:08x}-0000-4000-8000-000000000000, "
                f"model: H200}}\n" for i in range(gpus))
            + "defaults:\n  gpus: 1\n  max_gpus: 2\n"
            + f"line:\n  order: {order}\n  claim_window: {claim_window}\n"
            + "  half_life: 7d\n  max_wait: 1d\n")
    config = parse_gpus_config(text, "bench-scarcity-gpus.yaml")
    inventory = [Gpu(e.index, e.uuid, e.model) for e in config.gpus]
    return config, inventory


def simulate(policy: str, members: int = 30, gpus: int = 8, days: float = 30, seed: int = 1,
             retry_every: float = 15 * 60, usage_every: float = 600,
             claim_window: str = "10m") -> tuple[Result, list[str]]:
    order = "fair_share" if policy == FAIR_SHARE else "first_come"
    config, inventory = lab_config(gpus, order, claim_window)
    lab_members = people(members)
    lab = Lab(policy, config, inventory, lab_members, seed, START + days * DAY, retry_every,
              usage_every)
    return lab.run(), [name for name, _ in lab_members]


def people(members: int) -> list[tuple[str, Kind]]:
    """The lab's members, (name, kind), heavy users first: the same in every bench."""
    return [(f"m{i:02d}-{k.name}", k) for i, k in enumerate(kinds(members))]


# ---------------------------------------------------------------- the report


def report(results: Sequence[Result], names: Sequence[str], gpus: int, days: float) -> str:
    base = results[0]
    lab_gpu_seconds = gpus * days * DAY
    asked_hours = sum(base.asked_gpu_seconds.values()) / HOUR

    def mean(values: Sequence[float]) -> float:
        return statistics.fmean(values) if values else 0.0

    rows: list[tuple[str, list[float], str]] = [
        ("asks made", [r.asked for r in results], "{:.0f}"),
        ("asks served (the GPUs hers)", [r.served for r in results], "{:.0f}"),
        ("  of them not opened in time", [r.not_opened for r in results], "{:.0f}"),
        ("asks given up waiting", [r.gave_up for r in results], "{:.0f}"),
        ("mean wait, minutes", [mean(r.waits) / 60 for r in results], "{:.1f}"),
        ("p95 wait, minutes", [percentile(r.waits, 95) / 60 for r in results], "{:.1f}"),
        ("mean minutes until served or given up",
         [mean(r.ended) / 60 for r in results], "{:.1f}"),
        ("mean wait of light members, minutes",
         [mean(r.waits_by_kind["light"]) / 60 for r in results], "{:.1f}"),
        ("mean wait of heavy members, minutes",
         [mean(r.waits_by_kind["heavy"]) / 60 for r in results], "{:.1f}"),
        ("GPU-hours idle while someone waited",
         [r.idle_while_waiting / HOUR for r in results], "{:.1f}"),
        ("GPU-hours held by servers not yet opened",
         [r.unopened / HOUR for r in results], "{:.1f}"),
        ("GPU utilization (sessions), %",
         [100 * r.in_sessions / lab_gpu_seconds for r in results], "{:.1f}"),
        ("Jain's index of served share", [r.fairness(names) for r in results], "{:.3f}"),
    ]
    lines = table(rows, [r.policy for r in results], [f"{r.policy} / 409" for r in results[1:]])
    timing = "; ".join(
        f"{r.policy}: {r.seconds:.1f} s"
        + (f", {r.plans} plans of {1000 * r.plan_seconds / r.plans:.2f} ms" if r.plans else "")
        for r in results)
    return "\n".join([
        f"{len(names)} members, {gpus} GPUs, {days:g} days; {asked_hours:.0f} GPU-hours "
        f"asked under {base.policy} ({100 * asked_hours * HOUR / lab_gpu_seconds:.0f} % of "
        f"the lab's)",
        *lines,
        f"real time: {timing}",
        f"(a wait is from asking until the GPUs were hers; ratios: each policy's figure "
        f"over {base.policy}'s)",
    ])


def table(rows: Sequence[tuple[str, Sequence[float], str]], columns: Sequence[str],
          ratios: Sequence[str]) -> list[str]:
    """*rows* of (label, one value per column, format) under the *columns*' names, then
    each later column's value over the first column's, under the names *ratios* ("-"
    where the first is 0)."""
    width = max(len(label) for label, _, _ in rows)
    head = f"{'':{width}}  " + "  ".join(f"{c:>14}" for c in columns)
    ratio_head = "  ".join(f"{c:>14}" for c in ratios)
    lines = [f"{head}  {ratio_head}"]
    for label, values, fmt in rows:
        cells = "  ".join(f"{fmt.format(v):>14}" for v in values)
        over = "  ".join(f"{(v / values[0]):>13.2f}x" if values[0] else f"{'-':>14}"
                         for v in values[1:])
        lines.append(f"{label:{width}}  {cells}  {over}")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scarcity", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=30)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--retry-every", type=float, default=15 * 60,
                        help="mean seconds between a member's tries after a 409 (default 900)")
    parser.add_argument("--usage-every", type=float, default=600,
                        help="seconds between refreshes of members' GPU-hours (default 600)")
    parser.add_argument("--claim-window", default="10m", help="line.claim_window (default 10m)")
    args = parser.parse_args(argv)
    results, names = [], []
    for policy in POLICIES:
        result, names = simulate(policy, args.members, args.gpus, args.days, args.seed,
                                 args.retry_every, args.usage_every, args.claim_window)
        results.append(result)
    print(f"bench.scarcity, seed {args.seed}: " + report(results, names, args.gpus, args.days))


if __name__ == "__main__":
    main()
