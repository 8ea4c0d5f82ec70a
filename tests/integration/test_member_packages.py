"""Members install packages themselves, without root, and keep them; nobody else sees them.

`%pip install` in a notebook installs into the member's home (~/.local, on their home
volume), which survives a restart of their server; a member can also make their own
environment and register it as a kernel (docs/members.md, "Members' own packages"). The
package is a small wheel the member uploads to their home, as they would in JupyterLab:
the test stack's containers have no package index to reach.
"""

from __future__ import annotations

import base64
import json
import re

import pytest
import requests

from ..wheels import wheel_bytes
from .browser import run_in_new_notebook, screenshot, sign_in_to_lab
from .stack import container_logs

pytestmark = pytest.mark.integration

PACKAGE, VERSION = "gpulabhello", "1.0"
WHEEL = f"{PACKAGE}-{VERSION}-py3-none-any.whl"
GREETING = "hello from a member's own install"


def small_wheel() -> bytes:
    """A pure-Python wheel of package gpulabhello, made the way the wheel spec says."""
    return wheel_bytes(PACKAGE, VERSION, {f"{PACKAGE}/__init__.py": f"GREETING = {GREETING!r}\n"})


def upload(user, name: str, data: bytes) -> None:
    """Put a file in the member's home through the contents API (JupyterLab's upload)."""
    r = user.api("PUT", f"/contents/{name}", json={
        "type": "file", "format": "base64", "content": base64.b64encode(data).decode()})
    assert r.status_code in (200, 201), r.text


FIND = (f"import importlib.util, json; spec = importlib.util.find_spec({PACKAGE!r}); "
        f"print(json.dumps(spec and spec.origin))")


def test_pip_install_in_a_notebook_lands_in_the_home_and_stays(lab_user, new_page):
    alice, bob = lab_user("pip"), lab_user("pip")
    alice.start_server()
    upload(alice, WHEEL, small_wheel())

    # as a member does: install, and import in the same cell, in a home where nothing was
    # ever installed (the first install makes the user site, which a kernel puts on its
    # sys.path only if it existed when the kernel started)
    page = new_page()
    sign_in_to_lab(page, alice.name, alice.token)
    run_in_new_notebook(page, f"%pip install {WHEEL}\nimport {PACKAGE}\nprint({PACKAGE}.GREETING)",
                        re.compile(f"{GREETING}|Error"))
    output = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
    screenshot(page, "member-pip-install.png")
    assert f"Successfully installed {PACKAGE}" in output, output
    assert output.strip().splitlines()[-1] == GREETING, output

    alice.stop_server()
    alice.start_server()
    out = alice.run_code(f"import {PACKAGE}; print({PACKAGE}.GREETING); print({PACKAGE}.__file__)")
    assert out.splitlines() == [
        GREETING, f"/home/jovyan/.local/lib/python3.11/site-packages/{PACKAGE}/__init__.py"]
    # installing did not touch the image's packages: another member does not have it
    bob.start_server()
    assert json.loads(bob.run_code(FIND)) is None


MAKE_ENV = f"""
import subprocess, sys
env = "/home/jovyan/envs/mine"
subprocess.run([sys.executable, "-m", "venv", env], check=True)
# builds on the lab's packages (ipykernel, torch), below the env's own
open(f"{{env}}/lib/python3.11/site-packages/lab.pth", "w").write(
    "/opt/venv/lib/python3.11/site-packages\\n")
subprocess.run([f"{{env}}/bin/pip", "install", "--quiet", "{WHEEL}"], check=True)
subprocess.run([f"{{env}}/bin/python", "-m", "ipykernel", "install", "--user",
                "--name", "mine", "--display-name", "Python (mine)"], check=True,
               capture_output=True)
print("made")
"""


def test_a_member_environment_becomes_a_kernel_that_stays(lab_user):
    alice = lab_user("venv")
    alice.start_server()
    upload(alice, WHEEL, small_wheel())
    assert alice.run_code(MAKE_ENV, timeout=300).strip() == "made"
    # the default kernel does not have what went into the environment
    assert json.loads(alice.run_code(FIND)) is None

    alice.stop_server()
    alice.start_server()
    specs = alice.api("GET", "/kernelspecs").json()["kernelspecs"]
    assert specs["mine"]["spec"]["display_name"] == "Python (mine)", specs.keys()
    r = alice.api("POST", "/kernels", json={"name": "mine"})
    assert r.status_code == 201, r.text
    kernel = r.json()["id"]
    try:
        out = alice.execute(kernel, f"import sys, torch, {PACKAGE}; print(sys.prefix); "
                                    f"print({PACKAGE}.__file__)")
    finally:
        alice.api("DELETE", f"/kernels/{kernel}")
    assert out.splitlines() == [
        "/home/jovyan/envs/mine",
        f"/home/jovyan/envs/mine/lib/python3.11/site-packages/{PACKAGE}/__init__.py"]


def test_jupyterlab_neither_prompts_for_news_nor_calls_out(lab_user, new_page):
    """No "Jupyter news" prompt, and no request from the server to the internet for
    news or JupyterLab updates when a member opens JupyterLab (the image's overrides)."""
    alice = lab_user("quiet")
    page = new_page()
    sign_in_to_lab(page, alice.name, alice.token)
    setting = requests.get(
        f"{alice.server_url}/lab/api/settings/@jupyterlab/apputils-extension:notification",
        headers={"Authorization": f"token {alice.token}"}, timeout=30)
    assert setting.status_code == 200, setting.text
    defaults = {key: spec.get("default")
                for key, spec in setting.json()["schema"]["properties"].items()}
    assert defaults["fetchNews"] == "false" and defaults["checkForUpdates"] is False, defaults
    page.wait_for_timeout(3000)  # the prompt, where it is on, comes within a second of load
    assert page.get_by_text("official Jupyter news").count() == 0
    log = container_logs(alice.container, 300)
    # "SSL Error ... 443" was the server's call to pypi.org for updates (failing here)
    assert "SSL Error" not in log and "/lab/api/news" not in log, log
