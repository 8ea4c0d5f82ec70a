"""The GPU culler on the real stack: a member whose leased GPU sits idle is warned on their
hub home page (Chromium), then their server is stopped and the GPU goes to the next
member; a member whose GPU works keeps it.

The exporter's fake GPUs are held at 0 % and 80 % utilization (the control file); the
culler reads that back from Prometheus, as it does on a real host. gpus.yaml is edited
while the hub runs, as an admin would (the culler reads it every second): an idle
timeout and a warning of a few scrapes (20 s and 10 s on the test stack, which scrapes
every 2 s; 45 s and 20 s on a lab's 15 s), checked every 2 s.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

import pytest

from .browser import screenshot, submit_login
from .fake_gpus import exporter_snapshot
from .stack import HUB_URL, container_logs, scrape_seconds, wait_for
from .standin import GPU0, GPU1, STANDIN_GPUS, gpus_of

pytestmark = pytest.mark.integration

def timings(scrape: int) -> tuple[int, int, int, int]:
    """(idle timeout, warning; then a longer idle timeout and warning) in seconds, from
    the stack's scrape interval: a few scrapes of history, so that the culler judges from
    samples (45, 20, 75, 60 at a lab's 15 s; 20, 10, 40, 30 on the test stack's 2 s). The
    longer warning leaves the next member time to see it (a reload every 2 s), make her
    GPU work, and have the exporter, Prometheus and the culler see that (a second, a
    scrape, a check) before her server's stop time: about 10 s on the test stack under
    load, so 30 s. (Once her server was stopped with its GPU at 80 % in CI: her idle
    clock had started at her start, not at her part of the test; it no longer does.)"""
    warning = max(30, 4 * scrape)
    return (max(20, 3 * scrape), max(10, 4 * scrape // 3), warning + max(10, scrape),
            warning)


CHECK_EVERY = 2  # seconds (culling.check_every)


def culling(idle_timeout: int, warn_before: int) -> str:
    return STANDIN_GPUS + f"""  gpu_idle_timeout: {idle_timeout}s
culling:
  idle_below: 5%
  warn_before: {warn_before}s
  check_every: {CHECK_EVERY}s
"""


def notices(page, kind: str):
    return page.locator(f"#gpu-notices .gpu-notice[data-kind={kind}]")


def test_an_idle_gpu_is_warned_then_taken_back_and_a_busy_one_is_kept(
        hub, lab_user, lab_config, gpus_yaml, fake_control, new_page, hub_admin):
    scrape = scrape_seconds()
    IDLE_TIMEOUT, WARN_BEFORE, LONG_IDLE, LONG_WARNING = timings(scrape)  # noqa: N806
    lab_config.write("gpus.yaml", culling(IDLE_TIMEOUT, WARN_BEFORE))
    fake_control({"utilization": {"0": 0, "1": 80}})
    wait_for(lambda: [g["utilization_ratio"] for g in exporter_snapshot()["gpus"]] == [0.0, 0.8],
             30, what="the exporter to report the held utilizations")
    idle, busy, after = lab_user("idle"), lab_user("busy"), lab_user("next")

    idle.start_server({"gpus": 1})
    started = time.monotonic()
    # the culler counts idleness from the hub's `started` (the spawn's start), which is
    # a spawn's length before start_server returns here
    hub_started = datetime.fromisoformat(hub.server_model(idle.name)["started"]).timestamp()
    busy.start_server({"gpus": 1})
    assert gpus_of(idle.container)["label"] == GPU0
    assert gpus_of(busy.container)["label"] == GPU1

    # an operator watches the GPU dashboard (signed in now, so that the warning's 20 s
    # are not spent signing in)
    ops = new_page()
    submit_login(ops, hub_admin.name, hub_admin.token, next_url="/services/gpus/")
    assert "/services/gpus/" in ops.url, ops.url

    # the idle member sees the warning on their home page while the server still runs
    page = new_page()
    submit_login(page, idle.name, idle.token, next_url="/hub/home")

    def warned():
        page.reload()
        return notices(page, "warning").count() == 1

    wait_for(warned, 120, interval=2, what="the GPU culler's warning on the home page")
    seen = time.monotonic()
    assert hub.server_model(idle.name) is not None, "stopped before the warning was shown"
    text = notices(page, "warning").inner_text()
    assert "Your server will be stopped in less than a minute" in text, text  # 20 s warning
    assert f"its GPU stayed under 5% utilization for {IDLE_TIMEOUT} s" in text, text
    screenshot(page, "gpu-culler-warning.png")
    # and the dashboard (which redraws itself every 5 s) shows it beside the lease
    cull = ops.locator(".cull").first
    cull.wait_for(state="visible", timeout=15_000)
    assert cull.inner_text().startswith("to be stopped at "), cull.inner_text()
    assert idle.name in ops.locator("div", has=cull).last.inner_text()

    # then it is stopped, not before the timeout and the warning time
    wait_for(lambda: hub.server_model(idle.name) is None, 120, interval=1,
             what="the GPU culler to stop the idle server")
    stopped = time.monotonic()
    assert time.time() - hub_started >= IDLE_TIMEOUT, time.time() - hub_started
    log = container_logs("gpulab-hub", 400)
    warned_line = re.search(rf"GPU culler: warned {re.escape(idle.name)} that their server "
                            rf"stops at", log)
    stopped_line = re.search(rf"GPU culler: stopped {re.escape(idle.name)}'s server, warned "
                             rf"(.+?) ago", log)
    assert warned_line and stopped_line, log[-3000:]
    print(f"idle server: warning seen {seen - started:.0f} s after its start, stopped after "
          f"{stopped - started:.0f} s; the culler says it warned {stopped_line.group(1)} before")

    # the member is told what happened when they come back
    page.goto(f"{HUB_URL}/hub/home")
    assert notices(page, "warning").count() == 0
    text = notices(page, "stopped").inner_text()
    assert "Your server was stopped: its GPU stayed under 5% utilization" in text, text
    screenshot(page, "gpu-culler-stopped.png")
    # also where JupyterLab's tab lands when it reconnects: "Server not running"
    page.goto(f"{HUB_URL}/user/{idle.name}/lab")
    assert "Server not running" in page.locator("h1").first.inner_text()
    assert "its GPU stayed under 5% utilization" in notices(page, "stopped").inner_text()

    # and the GPU it held goes to the next member
    after.start_server({"gpus": 1})
    assert gpus_of(after.container)["label"] == GPU0
    # (she works until her part below, so that her idle clock starts there and not at her
    # start: what comes between once took her whole warning time in CI; from now on a
    # longer timeout and warning, so that she is warned and can make it work again in time)
    fake_control({"utilization": {"0": 80, "1": 80}})
    lab_config.write("gpus.yaml", culling(LONG_IDLE, LONG_WARNING))

    # the busy member's server, as old as the idle one was when it stopped and more, is
    # never warned
    time.sleep(max(0.0, started + IDLE_TIMEOUT + WARN_BEFORE + 10 - time.monotonic()))
    assert hub.server_model(busy.name) is not None
    assert f"warned {busy.name}" not in container_logs("gpulab-hub", 1000)

    # starting again clears the stop notice
    idle.start_server({"gpus": 0})
    wait_for(lambda: (page.reload() or True) and notices(page, "stopped").count() == 0, 30,
             interval=2, what="the stop notice to go once the server runs again")

    # the next member leaves GPU 0 idle too and is warned; their GPU then works again
    # (within the warning time, made longer than Prometheus' scrapes need to see it):
    # the warning goes and the server stays
    page = new_page()
    submit_login(page, after.name, after.token, next_url="/hub/home")
    fake_control({"utilization": {"0": 0, "1": 80}})

    def warned_next():
        page.reload()
        return notices(page, "warning").count() == 1

    wait_for(warned_next, 90, interval=2, what="the next member's warning")
    fake_control({"utilization": {"0": 80, "1": 80}})
    wait_for(lambda: not warned_next(), 60, interval=2,
             what="the warning to be withdrawn once the GPU works")

    def withdrawal_logged() -> str:
        log = container_logs("gpulab-hub", 1000)
        return log if f"GPU culler: {after.name}'s server is no longer due to stop" in log else ""

    log = wait_for(withdrawal_logged, 10, what="the culler's log of the withdrawal")
    # and it is not stopped at the time the warning gave, nor at the two checks after
    due = re.search(rf"GPU culler: warned {re.escape(after.name)} that their server stops at "
                    rf"(\S+ \S+) UTC", log)
    assert due, log[-3000:]
    due_at = datetime.fromisoformat(due.group(1)).replace(tzinfo=UTC).timestamp()
    time.sleep(max(0.0, due_at + 2 * CHECK_EVERY - time.time()))
    assert hub.server_model(after.name) is not None
