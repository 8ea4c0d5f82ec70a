"""bench/jobs.py's simulation, on small labs whose outcome can be worked out by hand: a
job holds its GPUs only while it runs, waits in the same line as servers, is cut at its
limit; the month is the same for the same seed, and the same in both scenarios when
nobody submits jobs."""

from __future__ import annotations

import itertools

import pytest

from bench.jobs import (
    FIGURES,
    RUNNING,
    JobLab,
    Work,
    compare,
    figures,
    in_use,
    job_members,
    report,
    work,
)
from bench.scarcity import HOUR, REGULAR, START, Ask, lab_config, people

MINUTE = 60.0
NEVER = Work(think=1e9, gpus=1, session=HOUR, patience=HOUR, opens_after=0)


def lab(gpus: int, order: str = "first_come", **streams: list[Work]) -> JobLab:
    config, inventory = lab_config(gpus, order, "10m")
    return JobLab("test", config, inventory, [(name, REGULAR) for name in streams], seed=0,
                  until=START + 86400, usage_every=600,
                  streams={name: itertools.chain(asked, itertools.repeat(NEVER))
                           for name, asked in streams.items()})


def at(hours: float, minutes: float = 0) -> float:
    """Think time from Monday 00:00 to Monday hh:mm (working hours start at 08:00)."""
    return hours * HOUR + minutes * MINUTE


def server(think: float, hours: float = 1, busy: float = 0.4,
           opens_after: float | None = 60) -> Work:
    return Work(think, 1, hours * HOUR, 10 * HOUR, opens_after, busy=busy)


def job(think: float, hours: float = 1, intensity: float = 0.95,
        limit_hours: float = 8) -> Work:
    # busy 1: the run is the whole session given
    return work(Ask(think, 1, hours * HOUR, 10 * HOUR, None), 1.0, intensity, True,
                limit_hours * HOUR)


def test_a_job_holds_its_gpus_only_while_it_runs():
    # alice's server holds the one GPU 09:00-10:00 (busy 40 %); bob's job, submitted at
    # 09:10, starts at 10:00 though nobody opens it, and gives the GPU back at 11:00 to
    # carol's server, asked for at 09:20
    asked = {"alice": [server(at(9), opens_after=0)], "bob": [job(at(9, 10))],
             "carol": [server(at(9, 20))]}
    result = lab(1, **asked).run()
    assert result.waits == [0, 50 * MINUTE, 100 * MINUTE]
    assert result.job_waits == [50 * MINUTE]
    assert (result.jobs, result.not_opened, result.gave_up) == (1, 0, 0)
    assert result.held_by_jobs == HOUR
    assert result.held == 3 * HOUR + MINUTE  # carol opened hers a minute after it started
    # held idle: the servers' 60 % not busy and carol's minute before she opened it; the
    # job's none
    assert result.held_idle == pytest.approx(2 * 0.6 * HOUR + MINUTE)
    assert result.computing == pytest.approx(0.4 * HOUR + 0.95 * HOUR + 0.4 * HOUR)
    assert result.idle_while_waiting == 0


def test_a_lab_of_jobs_holds_no_gpu_idle():
    asked = {"alice": [job(at(9), 2)], "bob": [job(at(9, 10), 1, intensity=0.9)]}
    result = lab(1, **asked).run()
    assert result.waits == [0, 110 * MINUTE]
    assert result.held == result.held_by_jobs == 3 * HOUR
    assert result.held_idle == 0
    assert result.computing == pytest.approx(0.95 * 2 * HOUR + 0.9 * HOUR)


@pytest.mark.parametrize("order, as_job, first", [
    ("first_come", "heavy", "heavy"), ("first_come", "light", "heavy"),
    ("fair_share", "heavy", "light"), ("fair_share", "light", "light")])
def test_jobs_and_servers_wait_in_one_line_in_its_order(order, as_job, first):
    # heavy used the GPU 08:00-08:30 and asks again at 09:05; light asks at 09:10; the
    # GPU is busy until 12:00. One of the two asks is a job: the order alone decides
    def ask(name: str, think: float) -> Work:
        return job(think) if name == as_job else server(think)

    simulation = lab(1, order, heavy=[server(at(8), 0.5, opens_after=0), ask("heavy", 35 * MINUTE)],
                     holder=[server(at(8, 40), 3 + 1 / 3, busy=1, opens_after=0)],
                     light=[ask("light", at(9, 10))])
    simulation.until = START + at(12, 2)
    simulation.run()
    states = {name: m.state for name, m in simulation.members.items()}
    second = "light" if first == "heavy" else "heavy"
    assert states[first] == (RUNNING if first == as_job else "working"), states
    assert states[second] == "waiting", states


def test_a_job_longer_than_its_limit_is_cut_there():
    long = job(at(9), 10, limit_hours=8)
    assert (long.run, long.cut, long.patience) == (8 * HOUR, True, float("inf"))
    assert (job(at(9), 7.5).run, job(at(9), 7.5).cut) == (7.5 * HOUR, False)
    # its GPU goes to bob's server at 17:00, when the job is cut
    result = lab(1, alice=[long], bob=[server(at(9, 10), opens_after=0)]).run()
    assert result.waits == [0, 7 * HOUR + 50 * MINUTE]
    assert (result.jobs, result.jobs_cut) == (1, 1)
    assert result.held_by_jobs == 8 * HOUR


def test_a_job_runs_the_computing_part_of_the_session_it_replaces():
    ask = Ask(0, 2, 5 * HOUR, HOUR, 60)
    as_server, as_job = (work(ask, 0.4, 0.95, job, 8 * HOUR) for job in (False, True))
    assert (as_server.job, as_server.session, as_server.patience) == (False, 5 * HOUR, HOUR)
    assert (as_job.job, as_job.run, as_job.gpus) == (True, pytest.approx(2 * HOUR), 2)


@pytest.mark.parametrize("state, computing, idle", [
    (RUNNING, 2 * 0.95, 0), ("working", 2 * 0.4 * 0.95, 2 * 0.6), ("offered", 0, 2)])
def test_what_held_gpus_do(state, computing, idle):
    ask = Work(0, 2, HOUR, HOUR, 0, busy=0.4, intensity=0.95)
    assert in_use(state, 2, ask) == (pytest.approx(computing), pytest.approx(idle))


def test_job_members_are_the_share_spread_over_the_kinds():
    names = [name for name, _ in people(10)]  # 2 heavy, 5 regular, 3 light
    assert job_members(names, 0) == set()
    assert job_members(names, 1) == set(names)
    half = job_members(names, 0.5)
    assert len(half) == 5
    assert {name.split("-")[1] for name in half} == {"heavy", "regular", "light"}
    assert len(job_members(names, 0.3)) == 3


def test_the_same_seed_gives_the_same_figures():
    small = {"members": 6, "gpus": 2, "days": 3, "seed": 3}
    one, two = compare(0.5, **small), compare(0.5, **small)
    assert [figures(r, 2, 3) for r in one] == [figures(r, 2, 3) for r in two]
    assert one[0].jobs == 0 and one[1].jobs > 0 and one[0].asked > 0
    text = report(one, 2, 3)
    for label, _, _ in FIGURES:
        assert label in text
    assert "real seconds" in text and "b / a" in text


def test_with_no_jobs_the_two_scenarios_are_the_same_month():
    for order in ("first_come", "fair_share"):
        a, b = compare(0.0, members=6, gpus=2, days=3, seed=5, order=order)
        assert figures(a, 2, 3) == figures(b, 2, 3)
        assert a.waits == b.waits and a.asked > 0
