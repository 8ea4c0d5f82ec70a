"""Jobs on the real stack: a member's command run as a named server of its own, through
the REST API her scripts use. It runs in her home on its leased GPU, writes ~/jobs/ID/log
and status.json, and stops its own server when the command ends, so the GPU goes back.
A job past its time limit is stopped and says so; a job cancelled (its server stopped)
says so. Bad jobs are 400s or 403s that start nothing and leave no named server behind. Her default server, on the same
home, watches ~/jobs as she would."""

from __future__ import annotations

import html
import json
import re

import pytest
import requests

from .browser import screenshot, sign_in_to_lab
from .restarts import kill_from_host, wait_restarted
from .smtp_sink import MAIL_ON
from .stack import (
    HUB_URL,
    container_gone,
    container_logs,
    docker,
    form_login,
    prometheus_query,
    wait_for,
)
from .standin import GPU0, STANDIN_GPUS

JOBS = STANDIN_GPUS.replace("  max_gpus: 1\n",
                            "  max_gpus: 1\n  max_servers: 3\n  max_server_age: 1h\n")
LEASES_API = f"{HUB_URL}/services/gpus/api/leases"
DASHBOARD_API = f"{HUB_URL}/services/gpus/api/gpus"


def status(member, job: str) -> dict | None:
    """~/jobs/JOB/status.json, read in her default server (the same home)."""
    text = docker("exec", member.container, "sh", "-c",
                  f"cat /home/jovyan/jobs/{job}/status.json 2>/dev/null || true")
    return json.loads(text) if text else None


def her_leases(admin, member) -> list[tuple[str, str, bool]]:
    """Her leases on the admins' lease page: (server, GPU, whether it is a job's)."""
    r = requests.get(LEASES_API, headers={"Authorization": f"token {admin.token}"}, timeout=30)
    assert r.status_code == 200, r.text
    return sorted((le["server"], le["gpu_uuid"], le["job"]) for le in r.json()["leases"]
                  if le["user"] == member.name)


def dashboard_holders(admin, member) -> list[tuple[str, bool]]:
    """Her servers that hold GPUs on the operators' dashboard: (server, whether a job)."""
    r = requests.get(DASHBOARD_API, headers={"Authorization": f"token {admin.token}"},
                     timeout=30)
    assert r.status_code == 200, r.text
    return sorted((h["server"], h["job"]) for g in r.json()["gpus"] for h in g["holders"]
                  if h["user"] == member.name)


def test_a_job_runs_her_command_on_its_gpu_and_gives_it_back_when_it_ends(
        lab_config, gpus_yaml, lab_user, hub, hub_admin):
    lab_config.write("gpus.yaml", JOBS)
    kim = lab_user("job")
    kim.start_server({"gpus": 0})  # where she watches her jobs from
    command = ("echo start; echo $NVIDIA_VISIBLE_DEVICES; pwd; "
               "while [ ! -e ~/go ]; do sleep 0.2; done; echo oops >&2; exit 3")
    r = kim.ask_server("j1", {"gpus": 1, "job": {"command": command, "time": "10m"}})
    assert r.status_code in (201, 202), r.text
    running = wait_for(lambda: (s := status(kim, "j1")) and s["state"] == "running" and s,
                       120, interval=0.5, what="her job to run")
    assert (running["command"], running["gpus"], running["time_limit"]) == (command, GPU0, 600)
    assert her_leases(hub_admin, kim) == [("j1", GPU0, True)]
    # the operators' dashboard says it is a job (the exporter reads the container's labels)
    holders = wait_for(lambda: dashboard_holders(hub_admin, kim), 60, interval=1,
                       what="the dashboard to show her job")
    assert holders == [("j1", True)], holders
    # and Prometheus (the usage page's jobs' GPU-hours come from this)
    wait_for(lambda: "=> 1 @" in prometheus_query(
        f'gpulab:user_job_gpus_held{{user="{kim.name}"}}'), 60, interval=1,
             what="Prometheus to record her job's GPU")
    docker("exec", kim.container, "touch", "/home/jovyan/go")  # her command goes on

    ended = wait_for(lambda: (s := status(kim, "j1")) and s["state"] != "running" and s,
                     120, interval=0.5, what="her job to end")
    assert (ended["state"], ended["exit_code"]) == ("exited", 3), ended
    assert ended["seconds"] > 0 and ended["gpu_hours"] > 0, ended
    log = docker("exec", kim.container, "cat", "/home/jovyan/jobs/j1/log")
    assert log.splitlines() == ["start", GPU0, "/home/jovyan", "oops"], log
    # the job's server stopped itself (its own token may), and its GPU went back
    wait_for(lambda: hub.server_model(kim.name, "j1") is None and container_gone(kim.container_of("j1")),
             60, interval=0.5, what="the job's server to be gone")
    assert f"DELETE /hub/api/users/{kim.name}/servers/j1" in container_logs("gpulab-hub", 800)
    assert her_leases(hub_admin, kim) == []
    # her home page says how it ended
    home = form_login(kim.name, kim.token).session.get(f"{HUB_URL}/hub/home", timeout=30)
    said = f"Your job j1: {command[:57]}... exited 3 after"
    assert said in html.unescape(home.text), home.text[-3000:]
    # started again, the same server is a notebook server: the job does not run twice
    kim.start_server({"gpus": 0}, server="j1")
    assert status(kim, "j1")["state"] == "exited"
    kim.stop_server(server="j1")


def test_a_job_past_its_time_or_cancelled_says_so(lab_config, gpus_yaml, lab_user, hub):
    lab_config.write("gpus.yaml", JOBS)
    lee = lab_user("job")
    lee.start_server({"gpus": 0})
    r = lee.ask_server("slow", {"gpus": 0, "job": {"command": "sleep 600", "time": "3s"}})
    assert r.status_code in (201, 202), r.text
    ended = wait_for(lambda: (s := status(lee, "slow")) and s["state"] != "running" and s,
                     120, interval=0.5, what="her job to reach its time limit")
    assert (ended["state"], ended["exit_code"]) == ("timed out", -15), ended

    r = lee.ask_server("cancel", {"gpus": 0, "job": "sleep 600"})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: (s := status(lee, "cancel")) and s["state"] == "running", 120,
             interval=0.5, what="the job to run")
    lee.stop_server(server="cancel")  # what `gpulab job cancel` does
    # (on a loaded machine its server may still be starting: the hub then gives the
    # start up, and the spawner stops its container just after, so wait for that)
    wait_for(lambda: status(lee, "cancel")["state"] == "stopped", 60, interval=0.5,
             what="her cancelled job to say it stopped")


def test_bad_jobs_are_refused_and_start_nothing(lab_config, gpus_yaml, lab_user, hub):
    lab_config.write("gpus.yaml", JOBS)
    ann, bob = lab_user("job"), lab_user("job")
    for server, options, status_, said in (
            ("b1", {"job": ""}, 400, "A job needs its command"),
            ("b2", {"job": {"command": "x", "time": "2h"}}, 400,
             "may be at most 1 h (max_server_age in the lab's gpus.yaml), got 2 h"),
            ("b3", {"job": {"command": "x", "cpu": 2}}, 400, "Unknown job option(s): cpu"),
            ("b4", {"job": "x" * (1 << 20)}, 400, "at most 64 KiB"),
            ("b5", {"gpus": 2, "job": "x"}, 403, "you may use at most 1"),
            ("", {"job": "x"}, 400, "A job runs as a named server of its own")):
        r = ann.ask_server(server, options)
        assert r.status_code == status_, (server, r.text)
        assert said in r.json()["message"], (server, r.text)
        assert container_gone(ann.container_of(server))
    # none of them is kept as a stopped named server (JupyterHub would keep each)
    r = hub.request("GET", f"/users/{ann.name}?include_stopped_servers=1")
    assert r.status_code == 200 and [n for n in r.json()["servers"] if n] == [], r.text
    # a job for another member: her token may not start his servers (JupyterHub says
    # nothing of what it does not show her: a 404)
    r = bob.ask_server("theirs", {"job": "id"}, ann.token)
    assert r.status_code == 404 and "No access" in r.json()["message"], r.text
    assert container_gone(bob.container_of("theirs"))


def test_she_is_emailed_how_her_job_ended(lab_config, lab_user, hub, smtp_server):
    """She gave her address with the job: the lab's SMTP server gets what her home page
    says, addressed to her; a lab without e-mail refuses the address and starts nothing.
    (No GPU: the members' lane runs it, beside the GPU tests.)"""
    ivy = lab_user("job")
    address = f"{ivy.name}@lab.example"
    job = {"gpus": 0, "job": "sleep 2; exit 4", "email": address}
    r = ivy.ask_server("nomail", job)
    assert r.status_code == 400 and "This lab sends no e-mail" in r.json()["message"], r.text
    assert container_gone(ivy.container_of("nomail"))
    settings = lab_config.original("gpulab.yaml")
    lab_config.write("gpulab.yaml", settings + MAIL_ON)
    try:
        r = ivy.ask_server("mailed", {**job, "email": f"{address}\r\nBcc: eve@evil.example"})
        assert r.status_code == 400 and "must be one e-mail address" in r.json()["message"]
        r = ivy.ask_server("mailed", job)
        assert r.status_code in (201, 202), r.text
        [(to, message)] = wait_for(smtp_server, 180, interval=1,
                                   what="the e-mail saying how her job ended")
    finally:
        lab_config.write("gpulab.yaml", settings)
    assert to == [address] and message["Subject"] == "Your job mailed ended", message
    body = message.get_content()
    said = re.search(r"your job mailed: (sleep 2; exit 4 exited 4 after \d+ s, "
                     r"0\.0 GPU-hours)\.", body)
    assert said, body
    assert "~/jobs/mailed/ (log and status.json)" in body, body
    # her home page says the same
    home = form_login(ivy.name, ivy.token).session.get(f"{HUB_URL}/hub/home", timeout=30)
    assert f"Your job mailed: {said.group(1)}" in html.unescape(home.text), home.text[-3000:]
    # her own token may not tell the hub that a notebook server's "job" ended (a notice,
    # an e-mail): only a job ends
    ivy.start_server({"gpus": 0}, server="notes")
    r = requests.post(f"{hub.api}/gpulab/jobs/{ivy.name}/notes", timeout=30,
                      headers={"Authorization": f"token {ivy.token}"},
                      json={"command": "x", "state": "exited", "exit_code": 0, "seconds": 1,
                            "gpu_hours": 0})
    assert r.status_code == 400 and "runs no job" in r.json()["message"], r.text
    home = form_login(ivy.name, ivy.token).session.get(f"{HUB_URL}/hub/home", timeout=30)
    assert "Your job notes" not in html.unescape(home.text)
    ivy.stop_server(server="notes")


@pytest.mark.disruptive  # kills the hub: runs alone (scripts/test-integration.sh)
def test_a_job_runs_on_through_a_hub_crash_and_ends_as_it_would(lab_user, hub):
    """The hub SIGKILLed under a running job: the job runs on (its container is not the
    hub's), ends while the hub is still coming back, and once the hub answers again her
    home page says how it ended and its server is gone, as without the crash."""
    zoe = lab_user("job")
    zoe.start_server({"gpus": 0})  # where she watches it from
    command = "while [ ! -e ~/go ]; do sleep 0.2; done; echo done"
    r = zoe.ask_server("crash", {"gpus": 0, "job": command})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: (s := status(zoe, "crash")) and s["state"] == "running", 120,
             interval=0.5, what="her job to run")
    before = kill_from_host("gpulab-hub")
    docker("exec", zoe.container, "touch", "/home/jovyan/go")  # it ends now, hub or not
    ended = wait_for(lambda: (s := status(zoe, "crash")) and s["state"] != "running" and s,
                     60, interval=0.5, what="her job to end")
    assert (ended["state"], ended["exit_code"]) == ("exited", 0), ended
    wait_restarted("gpulab-hub", before)
    wait_for(hub.is_ready, 120, what="the killed hub to answer again")
    wait_for(lambda: hub.server_model(zoe.name, "crash") is None
             and container_gone(zoe.container_of("crash")), 180, interval=1,
             what="the job's server to stop itself once the hub is back")
    home = form_login(zoe.name, zoe.token).session.get(f"{HUB_URL}/hub/home", timeout=30)
    assert f"Your job crash: {command} exited 0 after" in html.unescape(home.text), \
        home.text[-3000:]
    assert docker("exec", zoe.container, "cat", "/home/jovyan/jobs/crash/log") == "done"


def test_a_job_waits_in_the_line_and_runs_when_its_turn_comes(lab_config, gpus_yaml,
                                                             lab_user, hub):
    """No GPU free: her job waits in the same line as servers, and the line starts it
    with its command when the GPU comes free; nobody opens it, and it is not stopped for
    that: it runs to its end and gives the GPU back."""
    lab_config.write("gpus.yaml", JOBS.replace("  - {index: 1", "  # - {index: 1"))
    ann, mia = lab_user("job"), lab_user("job")
    ann.start_server({"gpus": 1})
    mia.start_server({"gpus": 0})
    r = mia.ask_server("queued", {"gpus": 1, "wait": True,
                             "job": {"command": "echo $NVIDIA_VISIBLE_DEVICES; sleep 2"}})
    assert r.status_code == 202 and "Your job starts by itself" in r.json()["message"], r.text
    r = requests.get(f"{hub.api}/gpulab/line/{mia.name}", timeout=30,
                     headers={"Authorization": f"token {mia.token}"})
    (entry,) = r.json()["line"]
    assert (entry["server"], entry["state"], entry["job"]) == (
        "queued", "waiting", {"command": "echo $NVIDIA_VISIBLE_DEVICES; sleep 2"})
    assert status(mia, "queued") is None  # nothing ran yet
    ann.stop_server()
    ended = wait_for(lambda: (s := status(mia, "queued")) and s["state"] != "running" and s,
                     180, interval=0.5, what="the line to start her job and the job to end")
    assert (ended["state"], ended["exit_code"], ended["gpus"]) == ("exited", 0, GPU0), ended
    assert docker("exec", mia.container, "cat", "/home/jovyan/jobs/queued/log") == GPU0
    wait_for(lambda: hub.server_model(mia.name, "queued") is None, 60, interval=0.5,
             what="the job's server to be gone")

    def her_line() -> list:
        r = requests.get(f"{hub.api}/gpulab/line/{mia.name}", timeout=30,
                         headers={"Authorization": f"token {mia.token}"})
        return r.json()["line"]
    wait_for(lambda: her_line() == [], 30, interval=1,
             what="the line service to see her job gone (it looks every 5 s)")


def test_gpulab_job_over_ssh_submits_lists_follows_and_cancels(lab_config, gpus_yaml,
                                                              lab_user, hub, tmp_path):
    """The member's command for jobs, as she runs it from her laptop: over real ssh into
    her default server (her login token as the password)."""
    from .test_ssh import SSH  # the OpenSSH client pointed at the gateway

    lab_config.write("gpus.yaml", JOBS)
    ned = lab_user("job")
    ned.start_server({"gpus": 0})
    ssh = SSH(tmp_path)
    r = ssh.run(ned.name, ned.token, command="gpulab-job submit --gpus 1 --name sshjob -- "
                                             "python -c 'print(6*7)'")
    assert r.returncode == 0 and r.stdout.startswith("sshjob: "), r
    r = ssh.run(ned.name, ned.token, command="gpulab-job logs sshjob -f", timeout=180)
    assert (r.returncode, r.stdout) == (0, "42\n"), r
    r = ssh.run(ned.name, ned.token, command="gpulab-job list")
    (row,) = [line.split() for line in r.stdout.splitlines() if line.startswith("sshjob")]
    assert row[:3] == ["sshjob", "exited", "0"], r.stdout
    r = ssh.run(ned.name, ned.token, command="gpulab-job submit --gpus 0 --name long -- "
                                             "sleep 600")
    assert r.returncode == 0, r
    wait_for(lambda: (s := status(ned, "long")) and s["state"] == "running", 120,
             interval=0.5, what="the long job to run")
    r = ssh.run(ned.name, ned.token, command="gpulab-job cancel long")
    assert (r.returncode, r.stdout) == (0, "long: stopped\n"), r
    # its server goes (what a cancelled job's status.json says is the test above's: in CI
    # a loaded machine once took longer than 60 s to write it here)
    wait_for(lambda: hub.server_model(ned.name, "long") is None
             and container_gone(ned.container_of("long")), 120, interval=0.5,
             what="the cancelled job's server to be gone")
    # and it is not listed as running, whether or not it wrote its end before it went
    r = ssh.run(ned.name, ned.token, command="gpulab-job list")
    rows = [line.split()[:2] for line in r.stdout.splitlines() if line.startswith("long ")]
    assert rows == [["long", "stopped"]], r
    r = ssh.run(ned.name, ned.token, command="gpulab-job submit --gpus 0 --name bad --")
    assert r.returncode != 0 and "give the command after --" in r.stderr, r


def test_run_as_job_from_jupyterlabs_file_browser(lab_user, hub, new_page):
    """In Chromium, as she does: right-click her script in JupyterLab's file browser, "Run
    as Job...", choose its GPUs, "Run": it runs as a job of its own (the image's
    hand-written labextension, its server extension, gpulab-job), and a bad choice is
    said in the dialog."""
    ava = lab_user("job")
    ava.start_server({"gpus": 0})
    docker("exec", ava.container, "sh", "-c", "mkdir -p /home/jovyan/exp && printf "
           "'import os\\nprint(\"ran in\", os.getcwd(), os.environ[\"NVIDIA_VISIBLE_DEVICES\"])"
           "\\n' > /home/jovyan/exp/fit.py")
    page = new_page()
    sign_in_to_lab(page, ava.name, ava.token)  # her running server: JupyterLab opens

    def run_as_job(name: str, gpus: str, limit: str = ""):
        page.locator('.jp-DirListing-item[data-isdir="true"]', has_text="exp").first.dblclick()
        item = page.locator('.jp-DirListing-item[data-isdir="false"]', has_text=name).first
        item.click()
        item.click(button="right")
        page.locator(".lm-Menu-item", has_text="Run as Job").first.click()
        dialog = page.locator(".jp-Dialog")
        run = dialog.locator(".jp-mod-accept")
        dialog.locator('input[name="gpus"]').fill("-1")
        assert run.is_disabled()  # JupyterLab's dialog takes no negative GPU count
        dialog.locator('input[name="gpus"]').fill(gpus)
        dialog.locator('input[name="time"]').fill(limit)
        run.click()
        said = page.locator(".gpulab-job-said")
        said.wait_for(state="visible", timeout=120_000)
        title = page.locator(".jp-Dialog-header").inner_text()
        text = said.inner_text()
        screenshot(page, f"run-as-job-{limit or 'ok'}.png")
        page.locator(".jp-Dialog .jp-mod-accept").click()
        page.locator(".jp-BreadCrumbs-home").first.click()  # back to her home
        return title, text

    # what the hub refuses, the dialog says (here through gpulab-job, as in a terminal)
    title, text = run_as_job("fit.py", "0", "soon")
    assert title == "The job was not started" and "expected a duration" in text, text
    assert "HTTP 400" in text, text
    title, text = run_as_job("fit.py", "0")
    job = re.fullmatch(r"Job (job-\d{8}-\d{6}) submitted", title)
    assert job, (title, text)
    assert f"its output: ~/jobs/{job[1]}/log" in text, text
    assert "Your hub home page says how it ended." in text, text
    ended = wait_for(lambda: (s := status(ava, job[1])) and s["state"] != "running" and s,
                     120, interval=0.5, what="her job to run and end")
    assert (ended["state"], ended["exit_code"], ended["command"]) == (
        "exited", 0, "cd exp && python fit.py"), ended
    log = docker("exec", ava.container, "cat", f"/home/jovyan/jobs/{job[1]}/log")
    assert log == "ran in /home/jovyan/exp void", log
