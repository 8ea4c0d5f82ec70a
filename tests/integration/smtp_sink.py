"""An SMTP server for the lab, on the hub's monitoring network (Python's own smtpd, in the
hub image): each message it is given, as a line of JSON in its log. The e-mail tests of
the line (test_line) and of jobs (test_jobs) read what reached it."""

from __future__ import annotations

import email
import email.policy
import json
import subprocess

import pytest

from .stack import docker

SMTP_NAME, SMTP_PORT = "gpulab-test-smtp", 2525
# what gpulab.yaml gains for the lab to send e-mail through it
MAIL_ON = (f"mail:\n  smtp_host: {SMTP_NAME}\n  smtp_port: {SMTP_PORT}\n  security: none\n"
           f"  from: gpulab@lab.example\n")
SMTP_SINK = f"""
import asyncore, json, smtpd, warnings
warnings.simplefilter("ignore")
class Sink(smtpd.SMTPServer):
    def process_message(self, peer, mailfrom, rcpttos, data, **kwargs):
        print(json.dumps({{"from": mailfrom, "to": rcpttos, "data": data.decode()}}), flush=True)
Sink(("0.0.0.0", {SMTP_PORT}), None)
asyncore.loop()
"""


@pytest.fixture
def smtp_server():
    """The lab's SMTP server: a function that answers the messages it got so far, as
    (recipients, message)."""
    docker("rm", "-f", SMTP_NAME, check=False)
    docker("run", "-d", "--name", SMTP_NAME, "--network", "gpulab-monitoring", "--user",
           "65534:65534", "--read-only", "--cap-drop", "ALL", "--entrypoint", "python3",
           "gpulab/hub:latest", "-u", "-c", SMTP_SINK)

    def received() -> list:
        logs = subprocess.run(["docker", "logs", SMTP_NAME], capture_output=True,
                              text=True, timeout=30).stdout
        return [(m["to"], email.message_from_string(m["data"], policy=email.policy.default))
                for m in map(json.loads, logs.splitlines())]

    yield received
    docker("rm", "-f", SMTP_NAME, check=False)
