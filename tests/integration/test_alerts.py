"""Alerts reach people: a real rule fires in Prometheus, Alertmanager (gpulab-alertmanager)
sends it to a webhook receiver, and a silence stops it.

The rule is the stack's own GpulabGpuLost (monitoring/prometheus/alerts.yml: a GPU that
answers no more for 1 minute), made to fire by losing one of the exporter's fake GPUs.
The receiver is a small HTTP server the test runs in a container on the monitoring
network, added to config/alertmanager.yml the way an admin adds one (with short
grouping intervals, so the test waits seconds, not hours) and put back afterwards.
Takes about two minutes: the rule's own `for: 1m` and Prometheus' 30 s evaluation.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import requests

from .stack import HUB_URL, LabConfig, container_logs, docker, exporter_flags, make, wait_for

pytestmark = pytest.mark.integration

RECEIVER = "gpulab-test-webhook"
LISTENER = r"""
import http.server, sys
class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        sys.stdout.write(body.decode() + "\n")
        sys.stdout.flush()
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("0.0.0.0", 8080), Receiver).serve_forever()
"""
CONFIG = f"""
route:
  receiver: nobody
  routes:
    - receiver: test-webhook
      matchers: ['alertname="GpulabGpuLost"']
      group_by: [alertname]
      group_wait: 1s
      group_interval: 2s
      repeat_interval: 4s
receivers:
  - name: nobody
  - name: test-webhook
    webhook_configs:
      - url: http://{RECEIVER}:8080/
        send_resolved: true
"""
AMTOOL = ["docker", "exec", "gpulab-alertmanager", "amtool",
          "--alertmanager.url=http://127.0.0.1:9093"]


def reload_alertmanager(config_text: str) -> None:
    """SIGHUP, then wait until Alertmanager serves exactly *config_text*'s receivers."""
    docker("kill", "-s", "HUP", "gpulab-alertmanager")
    names = [line.split(":", 1)[1].strip() for line in config_text.splitlines()
             if line.strip().startswith("- name:")]

    def loaded() -> bool:
        out = subprocess.run([*AMTOOL, "config", "show"], capture_output=True, text=True,
                             timeout=30).stdout
        return all(f"name: {n}" in out for n in names)
    wait_for(loaded, 30, interval=0.5, what="Alertmanager to load its new config")


def notifications() -> list[dict]:
    """What the receiver got: one JSON message per line of its log."""
    out = subprocess.run(["docker", "logs", RECEIVER], capture_output=True, text=True,
                         timeout=30).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def firing(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m.get("status") == "firing"
            and any(a["labels"].get("alertname") == "GpulabGpuLost" for a in m["alerts"])]


@pytest.fixture
def webhook_receiver():
    docker("rm", "-f", RECEIVER, check=False)
    docker("run", "-d", "--name", RECEIVER, "--network", "gpulab-monitoring", "--read-only",
           "--user", "65534:65534", "--cap-drop", "ALL", "gpulab/hub:latest",
           "python3", "-u", "-c", LISTENER)
    config = LabConfig()
    original = config.original("alertmanager.yml")
    try:
        config.write("alertmanager.yml", CONFIG)
        reload_alertmanager(CONFIG)
        yield
    finally:
        config.restore()
        reload_alertmanager(original)
        docker("rm", "-f", RECEIVER, check=False)


def dashboard_alerts(admin) -> list[str]:
    """The alert banners of the GPU dashboard, as its page's refresh gets them."""
    r = requests.get(f"{HUB_URL}/services/gpus/api/gpus", timeout=30,
                     headers={"Authorization": f"token {admin.token}"})
    assert r.status_code == 200, r.text
    return [b for b in r.json()["banners"] if b.startswith("Alert ")]


def test_a_lost_gpu_reaches_the_webhook_and_a_silence_stops_it(hub, hub_admin, fake_control,
                                                               webhook_receiver):
    silence = None
    try:
        fake_control({"lost": [1]})
        wait_for(lambda: len(firing(notifications())) >= 2, 240, interval=3,
                 what="GpulabGpuLost to fire and reach the webhook, twice (repeat_interval 4s)")
        message = firing(notifications())[0]
        alert = next(a for a in message["alerts"]
                     if a["labels"]["alertname"] == "GpulabGpuLost")
        assert alert["status"] == "firing"
        assert alert["labels"]["severity"] and alert["annotations"]["summary"], alert
        # and the operators' dashboard shows it
        banner = dashboard_alerts(hub_admin)
        assert any(b.startswith("Alert GpulabGpuLost (critical)") and "GPU 1" in b
                   for b in banner), banner

        silence = subprocess.run(
            [*AMTOOL, "silence", "add", "alertname=GpulabGpuLost", "--duration=10m",
             "--author=gpulab-tests", "--comment=test_alerts"],
            capture_output=True, text=True, timeout=30)
        assert silence.returncode == 0, silence.stderr
        silence = silence.stdout.strip()
        time.sleep(3)  # a notification already on its way may still land
        before = len(firing(notifications()))
        time.sleep(14)  # three repeat intervals
        assert len(firing(notifications())) == before, "a silenced alert was sent again"
        assert not any("GpulabGpuLost" in b for b in dashboard_alerts(hub_admin))
    finally:
        if silence:
            subprocess.run([*AMTOOL, "silence", "expire", silence], capture_output=True,
                           timeout=30)


def alertmanager_receivers() -> str:
    return subprocess.run([*AMTOOL, "config", "show"], capture_output=True, text=True,
                          timeout=30).stdout


@pytest.mark.disruptive  # make up, twice: runs alone (scripts/test-integration.sh)
def test_an_edit_of_alertmanager_yml_takes_effect_at_make_up_and_a_bad_one_is_refused():
    """A good edit applies at make up; a bad one is refused with Alertmanager's reason
    while Alertmanager keeps running its last good version, across its restarts."""
    config = LabConfig()
    original = config.original("alertmanager.yml")
    flags = exporter_flags()
    edited = original.replace("receivers:\n", "receivers:\n  - name: lab-extra\n", 1)
    assert edited != original
    try:
        config.write("alertmanager.yml", edited)
        make("up", flags)
        wait_for(lambda: "name: lab-extra" in alertmanager_receivers(), 60, interval=1,
                 what="Alertmanager to run the edited config")

        config.write("alertmanager.yml", edited.replace("receiver: lab\n", "receiver: nobody\n"))
        out = make("up", flags)  # says so, and goes on: the lab runs on
        assert "config/alertmanager.yml is not valid (above)" in out, out[-2000:]
        assert 'undefined receiver "nobody"' in out, out[-2000:]
        # Alertmanager, recreated for the changed file, starts on its last good version,
        # and does so again after a restart (a reboot) while the file is invalid.
        for _ in range(2):
            wait_for(lambda: docker("inspect", "-f", "{{.State.Running}}",
                                    "gpulab-alertmanager") == "true", 60,
                     what="Alertmanager to run")
            wait_for(lambda: "name: lab-extra" in alertmanager_receivers(), 60, interval=1,
                     what="Alertmanager to run its last good config")
            assert "runs its last good version" in container_logs("gpulab-alertmanager", 20)
            docker("restart", "gpulab-alertmanager")
    finally:
        config.restore()
        make("up", flags)
    assert "name: lab-extra" not in alertmanager_receivers()
