"""A simulated month of a lab in which a share of members submit their long work as GPU
jobs instead of holding interactive servers for it (a model: gpulab has no jobs yet): how
long members wait, how many GPU-hours are held with nothing running on them, and how much
of the lab's GPU time computes, for servers only against servers and jobs, side by side
in one run.

It extends :mod:`bench.scarcity`: the same members (heavy, regular and light users), the
same asks drawn from each member's own seeded stream, the same working hours, and every
decision made by gpulab's own code (:func:`gpulab.gpus.allocator.allocate` for a spawn or
a job that finds its GPUs free, counting the GPUs the line keeps; the line's turn by
:func:`gpulab.line.plan.plan` in its order, ``--order first_come`` (gpulab's default) or
``fair_share`` by decayed GPU-hours, :mod:`gpulab.line.order` and
:mod:`gpulab.line.usage`). No Docker, no hub, no sleeping: simulated time.

* An **interactive server** holds its GPUs for her whole session (log-normal, as in
  bench.scarcity) and computes on them only a *busy* part of it (drawn per ask, 30-50 %,
  spread evenly over the session); the rest of the session the GPUs are held with
  nothing running. A server the line starts for her is hers only if she opens it within
  the claim window; until then its GPUs are held with nothing running too.
* A **job** is a command she submits: 1 GPU, or 2 for heavy users three times in ten (the
  ask's GPUs). It waits in the same line as servers (one line, one order), starts the
  moment its GPUs are given (nobody has to open it: no claim window), computes on them
  for its whole run and gives them back when it ends. Its run is the computing part of
  the session it replaces (session x busy: the same work, log-normal times a busy
  fraction), cut at its time limit (``--limit-hours``, default 8). Nobody sits in front
  of a job: it waits until it starts (no patience). Her next ask comes when the session
  would have ended (she works on without GPUs), so both scenarios ask for the same work
  at the same pace.
* While work runs (a server's busy part, or a job) it uses its GPUs at an *intensity*
  drawn per ask, 90-100 %.

Scenarios, same seed, same members, same asks:

(a) **servers only**: today's lab, every ask a server, one line in ``--order``;
(b) **jobs**: a share of the members (``--job-share``, default 0.5, spread evenly over
    heavy, regular and light users) submit each ask of ``--long-hours`` (default 2) or
    more of session as a job; their shorter asks, and everyone else's, stay servers.

Figures, per scenario:

* *asks made*, *asks served* (the GPUs became hers: her server started, or her job) and
  *of them jobs*; *asks given up waiting* (servers only);
* *mean* and *p95 wait*: minutes from asking until the GPUs were hers, over asks served;
* *GPU-hours held*: GPUs held by servers and jobs, times the hours held;
* *GPU-hours held idle*: held with nothing running on them (a server's part that is not
  busy, and a server the line started that nobody has opened yet); a job's are 0;
* *GPU-hours idle while someone waited*: GPUs nobody held while someone waited for GPUs
  she could use (as bench.scarcity counts them: at most the GPUs the waiting asked for);
* *GPU utilization*: GPU-hours computing (held while busy, times the intensity) over the
  lab's GPU-hours (GPUs x days x 24);
* *real seconds*: the wall-clock time the simulation of that scenario took.

Ratios are each scenario's figure over (a)'s.

    python -m bench.jobs                         # 30 members, 8 GPUs, 30 days, seed 1
    python -m bench.jobs --job-share 0.8 --order fair_share --days 14
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from bench.scarcity import (
    DAY,
    FAIR_SHARE,
    FIRST_COME,
    HOUR,
    START,
    Ask,
    Kind,
    Lab,
    Member,
    Result,
    asks,
    lab_config,
    people,
    percentile,
    table,
)
from gpulab.gpus.allocator import Gpu
from gpulab.gpus.config import GpusConfig
from gpulab.line.plan import Place

BUSY = (0.3, 0.5)  # share of a server's session that computes
INTENSITY = (0.9, 1.0)  # how fully running work uses its GPUs
RUNNING = "running"  # a member's state while her job runs (bench.scarcity's: thinking,
# waiting, offered, working)
ORDERS = ("first_come", "fair_share")


# ---------------------------------------------------------------- the work asked


@dataclass(frozen=True)
class Work(Ask):
    """One ask with what it computes: a server (``job`` False) or a job."""

    busy: float = 1.0  # share of the session that computes (a server's)
    intensity: float = 1.0  # how fully the GPUs are used while work runs (0-1)
    job: bool = False
    run: float = 0.0  # a job's: seconds it runs, cut at its limit
    cut: bool = False  # a job's: longer than its limit, cut there


def work(ask: Ask, busy: float, intensity: float, job: bool, limit: float) -> Work:
    """*ask* as a server, or as a job: the session's computing part, cut at *limit*
    seconds, waiting in line as long as it takes."""
    fields = dataclasses.asdict(ask)
    if not job:
        return Work(**fields, busy=busy, intensity=intensity)
    run = ask.session * busy
    return Work(**{**fields, "patience": math.inf}, busy=busy, intensity=intensity, job=True,
                run=min(run, limit), cut=run > limit)


def works(seed: int, member: str, kind: Kind, submits_jobs: bool, long_after: float,
          limit: float) -> Iterator[Work]:
    """Her asks (bench.scarcity's, the same in every scenario), each with its busy share
    and intensity from a stream of her own; as jobs those of *long_after* seconds of
    session or more, if she *submits_jobs*."""
    rng = random.Random(f"{seed}:{member}:work")
    for ask in asks(seed, member, kind):
        busy, intensity = rng.uniform(*BUSY), rng.uniform(*INTENSITY)
        yield work(ask, busy, intensity, submits_jobs and ask.session >= long_after, limit)


def job_members(names: Sequence[str], share: float) -> set[str]:
    """The *share* of *names* who submit jobs, spread evenly through the list (members
    are listed heavy, regular, light)."""
    return {name for i, name in enumerate(names)
            if math.floor((i + 1) * share + 1e-9) > math.floor(i * share + 1e-9)}


def in_use(state: str, gpus: int, ask: Work) -> tuple[float, float]:
    """(GPUs computing, GPUs held with nothing running) for a member in *state* (a
    bench.scarcity state, or RUNNING) who holds *gpus*."""
    if state == RUNNING:
        return gpus * ask.intensity, 0.0
    if state == "working":
        return gpus * ask.busy * ask.intensity, gpus * (1 - ask.busy)
    return 0.0, float(gpus)  # offered: the line started her server, not opened yet


# ---------------------------------------------------------------- the simulation


@dataclass
class JobResult(Result):
    jobs: int = 0  # jobs started
    jobs_cut: int = 0  # of them, cut at their limit
    job_waits: list[float] = field(default_factory=list)  # seconds, per job started
    held: float = 0.0  # GPU-seconds held by servers and jobs
    held_by_jobs: float = 0.0  # GPU-seconds held by jobs
    held_idle: float = 0.0  # GPU-seconds held with nothing running
    computing: float = 0.0  # GPU-seconds computing (held while busy, times intensity)


class JobLab(Lab):
    """One scenario's month: bench.scarcity's lab in line order (``config.line.order``),
    where an ask may be a job (:class:`Work`)."""

    def __init__(self, label: str, config: GpusConfig, inventory: Sequence[Gpu],
                 members: Sequence[tuple[str, Kind]], seed: int, until: float,
                 usage_every: float, streams: Mapping[str, Iterator[Work]]):
        policy = FAIR_SHARE if config.line.order == "fair_share" else FIRST_COME
        super().__init__(policy, config, inventory, members, seed, until, math.inf,
                         usage_every, streams)
        self.result = JobResult(label)
        # each member's own stream of morning times, so that the scenarios' first asks
        # fall at the same times whatever happened to the others
        self.morning = {name: random.Random(f"{seed}:{name}:mornings") for name, _ in members}

    def mornings(self, m: Member) -> random.Random:
        return self.morning[m.name]

    def advance(self, t: float) -> None:
        span = t - self.now
        if span > 0:
            held = Counter(le.user for le in self.leases)
            for m in self.members.values():
                if held[m.name]:
                    computing, idle = in_use(m.state, held[m.name], m.ask)
                    self.result.held += span * held[m.name]
                    self.result.held_by_jobs += span * held[m.name] * (m.state == RUNNING)
                    self.result.computing += span * computing
                    self.result.held_idle += span * idle
        super().advance(t)

    def take(self, m: Member, gpus: Sequence[Gpu]) -> None:
        super().take(m, gpus)
        if m.ask.job:
            self.result.job_waits.append(self.now - m.asked_at)

    def offer(self, m: Member, place: Place) -> None:
        """Her turn: a job starts at once with the GPUs of her *place*; a server is
        offered as bench.scarcity offers it."""
        if not m.ask.job:
            super().offer(m, place)
            return
        self.take(m, place.gpus)
        del self.line[m.name]
        self.start_session(m)

    def start_session(self, m: Member) -> None:
        if not m.ask.job:
            super().start_session(m)
            return
        m.state, m.attempt = RUNNING, m.attempt + 1
        self.result.jobs += 1
        self.result.jobs_cut += m.ask.cut
        self.at(self.now + m.ask.run, "end", m)

    def on_end(self, m: Member) -> None:
        if not m.ask.job:
            super().on_end(m)
            return
        self.drop(m)  # the job ended: its GPUs go back at once
        self.next_ask(m, self.now + max(0.0, m.ask.session - m.ask.run))


def scenario(label: str, job_share: float, members: int = 30, gpus: int = 8,
             days: float = 30, seed: int = 1, order: str = "first_come",
             long_hours: float = 2, limit_hours: float = 8, usage_every: float = 600,
             claim_window: str = "10m") -> JobResult:
    config, inventory = lab_config(gpus, order, claim_window)
    lab_members = people(members)
    submitting = job_members([name for name, _ in lab_members], job_share)
    streams = {name: works(seed, name, kind, name in submitting, long_hours * HOUR,
                           limit_hours * HOUR) for name, kind in lab_members}
    lab = JobLab(label, config, inventory, lab_members, seed, START + days * DAY,
                 usage_every, streams)
    return lab.run()


def compare(job_share: float = 0.5, **kwargs) -> list[JobResult]:
    """(a) servers only and (b) *job_share* of the members submitting jobs, with the
    same *kwargs* (:func:`scenario`'s)."""
    return [scenario("a servers", 0.0, **kwargs),
            scenario(f"b {job_share:.0%} jobs", job_share, **kwargs)]


# ---------------------------------------------------------------- the report


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


# (label, format, figure of a result and the lab's GPU-seconds)
FIGURES: tuple[tuple[str, str, Callable[[JobResult, float], float]], ...] = (
    ("asks made", "{:.0f}", lambda r, lab: r.asked),
    ("asks served (GPUs hers)", "{:.0f}", lambda r, lab: r.served),
    ("  of them jobs", "{:.0f}", lambda r, lab: r.jobs),
    ("  jobs cut at their time limit", "{:.0f}", lambda r, lab: r.jobs_cut),
    ("  servers not opened in time", "{:.0f}", lambda r, lab: r.not_opened),
    ("asks given up waiting", "{:.0f}", lambda r, lab: r.gave_up),
    ("mean wait, minutes", "{:.1f}", lambda r, lab: _mean(r.waits) / 60),
    ("p95 wait, minutes", "{:.1f}", lambda r, lab: percentile(r.waits, 95) / 60),
    ("mean wait of jobs, minutes", "{:.1f}", lambda r, lab: _mean(r.job_waits) / 60),
    ("GPU-hours held", "{:.1f}", lambda r, lab: r.held / HOUR),
    ("  of them by jobs", "{:.1f}", lambda r, lab: r.held_by_jobs / HOUR),
    ("GPU-hours held idle", "{:.1f}", lambda r, lab: r.held_idle / HOUR),
    ("GPU-hours idle while someone waited", "{:.1f}",
     lambda r, lab: r.idle_while_waiting / HOUR),
    ("GPU utilization (computing), %", "{:.1f}", lambda r, lab: 100 * r.computing / lab),
)


def figures(result: JobResult, gpus: int, days: float) -> dict[str, float]:
    """Every figure of :data:`FIGURES` but the real seconds (which vary run to run)."""
    lab = gpus * days * DAY
    return {label: value(result, lab) for label, _, value in FIGURES}


def report(results: Sequence[JobResult], gpus: int, days: float) -> str:
    values = [figures(r, gpus, days) for r in results]
    rows = [(label, [v[label] for v in values], fmt) for label, fmt, _ in FIGURES]
    rows.append(("real seconds the simulation took", [r.seconds for r in results], "{:.1f}"))
    base = results[0].policy
    return "\n".join([
        *table(rows, [r.policy for r in results], [f"{r.policy[0]} / {base[0]}"
                                                   for r in results[1:]]),
        f"(a wait is from asking until the GPUs were hers; held idle: held with nothing "
        f"running; ratios: each scenario's figure over {base[0]}'s, {base})",
    ])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.jobs", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=30)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--job-share", type=float, default=0.5,
                        help="share of members who submit their long work as jobs, 0-1 "
                             "(default 0.5)")
    parser.add_argument("--order", choices=ORDERS, default="first_come",
                        help="line.order (default first_come, gpulab's)")
    parser.add_argument("--long-hours", type=float, default=2,
                        help="sessions this long or longer are submitted as jobs (default 2)")
    parser.add_argument("--limit-hours", type=float, default=8,
                        help="a job's time limit: longer runs are cut (default 8)")
    parser.add_argument("--usage-every", type=float, default=600,
                        help="seconds between refreshes of members' GPU-hours (default 600)")
    parser.add_argument("--claim-window", default="10m", help="line.claim_window (default 10m)")
    args = parser.parse_args(argv)
    if not 0 <= args.job_share <= 1:
        parser.error(f"--job-share {args.job_share}: expected a share from 0 to 1")
    results = compare(args.job_share, members=args.members, gpus=args.gpus, days=args.days,
                      seed=args.seed, order=args.order, long_hours=args.long_hours,
                      limit_hours=args.limit_hours, usage_every=args.usage_every,
                      claim_window=args.claim_window)
    print(f"bench.jobs, seed {args.seed}: {args.members} members, {args.gpus} GPUs, "
          f"{args.days:g} days, line order {args.order}; in b, "
          f"{len(job_members([n for n, _ in people(args.members)], args.job_share))} members "
          f"submit sessions of {args.long_hours:g} h or more as jobs (limit "
          f"{args.limit_hours:g} h)\n" + report(results, args.gpus, args.days))


if __name__ == "__main__":
    main()
