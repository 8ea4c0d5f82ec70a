"""The single-user image starts without work it need not do, and still validates.

Every start of a member's server used to compile its imports from source (members cannot
write bytecode to root's /opt/venv), and to build rfc3987-syntax's grammar (0.9 s) for a
format check nothing uses. The image now carries bytecode for what a start and a first
`import torch` import, and what opening TensorBoard or the GPU panel and a first plot
import (images/singleuser/compile_start_path.py), and no rfc3987-syntax.
These tests run the image as a member's server runs (uid 1000, read-only root) and a
real member's server on the stack; bench/spawn.py measures what it gains.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest
import requests

from gpulab.settings import load_settings

from .browser import screenshot, sign_in_to_lab
from .stack import REPO, LabConfig, container_logs, docker, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def image(hub) -> str:
    """The single-user image the running hub spawns (config/gpulab.yaml spawn.image)."""
    return load_settings(LabConfig().dir / "gpulab.yaml")["spawn.image"]


def run_as_member(image: str, script: str) -> str:
    return docker("run", "--rm", "--network", "none", "--read-only", "--user", "1000:1000",
                  "--tmpfs", "/tmp", "--tmpfs", "/home/jovyan:uid=1000,gid=1000", image,
                  "python", "-c", textwrap.dedent(script))


def uncompiled(start: str) -> str:
    """A script that runs *start* (what a process imports as it starts) and prints, as
    JSON, how many modules it imported and which of /opt/venv's have no bytecode."""
    return textwrap.dedent(start) + textwrap.dedent("""
        import importlib.util, json, os, sys
        missing = sorted(
            name for name, module in list(sys.modules.items())
            if (getattr(module, "__file__", None) or "").startswith("/opt/venv/")
            and module.__file__.endswith(".py")
            and not os.path.exists(importlib.util.cache_from_source(module.__file__)))
        print(json.dumps({"modules": len(sys.modules), "missing": missing}))
    """)


# What jupyterhub-singleuser does at start, short of listening: ServerApp.initialize
# links and loads every server extension (jupyterlab, jupyter_lsp, terminals, the
# hub's own), importing what they import; then a kernel's first cell.
SERVER_START = """
    import jupyterhub.singleuser.extension
    from jupyter_server.serverapp import ServerApp
    app = ServerApp()
    app.initialize(argv=["--ServerApp.root_dir=/tmp", "--ServerApp.port=0",
                         "--ServerApp.open_browser=False"])
    import ipykernel.kernelapp, ipykernel.ipkernel, torch, numpy
"""
# What the launcher's TensorBoard and GPUs cards start (processes of their own, started
# when a member opens them), and a cell that plots, shows a widget and logs for TensorBoard.
TOOLS_START = """
    import gpulab_gpus, pynvml, tensorboard.main
    from tensorboard import default, program
    program.TensorBoard(default.get_plugins())
    gpulab_gpus.snapshot()
    import matplotlib
    matplotlib.use("module://matplotlib_inline.backend_inline")
    import matplotlib.pyplot as plt, ipywidgets
    from torch.utils.tensorboard import SummaryWriter
    plt.plot([1, 2, 3])
    plt.gcf().canvas.print_figure(__import__("io").BytesIO(), format="png")
    ipywidgets.IntSlider()
"""
# The hub and the Docker proxies (gpulab/hub; read-only root filesystems, so they cannot
# cache bytecode either) and the exporter: pip compiles what it installs.
HUB_START = """
    import jupyterhub.app, dockerspawner, gpulab.hubconfig, gpulab.spawn.spawner, gpulab.login.auth
    import gpulab.login.tokens, gpulab.dockerapi.proxy, gpulab.netguard, gpulab.dashboard.app
"""
EXPORTER_START = "import gpulab_exporter.cli, gpulab_exporter.server, gpulab_exporter.collector, pynvml"


def assert_compiled(report: dict, image: str) -> None:
    assert report["modules"] > 150, report  # the check saw a real start
    assert report["missing"] == [], (
        f"{len(report['missing'])} modules a start imports have no bytecode in "
        f"{image}: {report['missing'][:40]}")


def test_what_a_server_start_imports_is_compiled_in_the_image(image):
    report = json.loads(run_as_member(image, uncompiled(SERVER_START)).splitlines()[-1])
    assert report["modules"] > 1000, report
    assert_compiled(report, image)


def test_what_opening_tensorboard_the_gpu_panel_and_a_plot_imports_is_compiled(image):
    report = json.loads(run_as_member(image, uncompiled(TOOLS_START)).splitlines()[-1])
    assert_compiled(report, image)


@pytest.mark.parametrize("image, start", [("gpulab/hub:latest", HUB_START),
                                          ("gpulab/exporter:latest", EXPORTER_START)])
def test_the_stack_images_carry_bytecode(image, start):
    out = docker("run", "--rm", "--network", "none", "--read-only", "--entrypoint", "python3",
                 image, "-c", uncompiled(start))
    assert_compiled(json.loads(out.splitlines()[-1]), image)


def without_rfc3987_events_checked(package: str, schema: str, schema_id: str,
                                   good: dict, extra: str = "") -> str:
    """A script printing whether rfc3987_syntax is installed, then (after *extra*)
    whether *package*'s event *schema* (a path inside it) still emits *good* and refuses
    it with an action no schema allows: what jsonschema checks without it."""
    return textwrap.dedent("""
        import importlib.util, io, logging, pathlib
        import jsonschema, {package}
        from jupyter_events import EventLogger

        print("rfc3987_syntax", importlib.util.find_spec("rfc3987_syntax") is not None)
        """).format(package=package) + textwrap.dedent(extra) + textwrap.dedent("""
        logger, sink = EventLogger(), io.StringIO()
        logger.register_handler(logging.StreamHandler(sink))
        logger.register_event_schema(pathlib.Path({package}.__file__).parent / {schema!r})
        logger.emit(schema_id={schema_id!r}, data={good!r})
        print("event emitted", {action!r} in sink.getvalue())
        try:
            logger.emit(schema_id={schema_id!r}, data=dict({good!r}, action="explode"))
            print("bad event: accepted")
        except jsonschema.ValidationError:
            print("bad event: refused")
        """).format(package=package, schema=schema, schema_id=schema_id, good=good,
                    action=f'"action": "{good["action"]}"')


def test_no_rfc3987_syntax_and_validation_still_works(image):
    # the notebook format, and the event the server emits when a member saves
    # (jupyter_server contents_service)
    out = run_as_member(image, without_rfc3987_events_checked(
        "jupyter_server", "event_schemas/contents_service/v1.yaml",
        "https://events.jupyter.org/jupyter_server/contents_service/v1",
        {"action": "save", "path": "a.ipynb"}, extra="""
        import nbformat
        from nbformat.v4 import new_code_cell, new_notebook

        nb = new_notebook(cells=[new_code_cell("import torch")])
        nbformat.validate(nb)
        del nb.cells[0]["source"]
        try:
            nbformat.validate(nb)
            print("notebook without source: accepted")
        except nbformat.ValidationError:
            print("notebook without source: refused")
        """))
    assert out.splitlines() == [
        "rfc3987_syntax False",
        "notebook without source: refused",
        "event emitted True",
        "bad event: refused",
    ], out


def test_the_hub_image_has_no_rfc3987_syntax_and_its_events_still_validate():
    """The hub image drops it too (0.8 s of every hub start): JupyterHub's own event
    (server-actions, logged at each start and stop) is still emitted and checked."""
    out = docker("run", "--rm", "--network", "none", "--read-only", "--entrypoint", "python3",
                 "gpulab/hub:latest", "-c", without_rfc3987_events_checked(
                     "jupyterhub", "event-schemas/server-actions/v1.yaml",
                     "https://schema.jupyter.org/jupyterhub/events/server-action",
                     {"action": "start", "username": "alice", "servername": ""}))
    assert out.splitlines() == ["rfc3987_syntax False", "event emitted True",
                                "bad event: refused"], out


def test_a_member_saves_and_reopens_a_notebook_on_the_lean_image(lab_user):
    """The same, where a member meets it: the contents API of a real server (it emits
    the save event and validates the notebook), with nothing in the server's log."""
    user = lab_user("images")
    user.start_server()
    cell = {"id": "first", "cell_type": "code", "source": "import torch", "metadata": {},
            "outputs": [], "execution_count": None}
    notebook = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    r = user.api("PUT", "/contents/saved.ipynb", json={"type": "notebook", "content": notebook})
    assert r.status_code == 201, r.text
    r = user.api("GET", "/contents/saved.ipynb")
    assert r.status_code == 200 and r.json()["content"]["cells"][0]["source"] == "import torch"
    bad = dict(notebook, cells=[dict(cell, execution_count="one")])
    r = user.api("PUT", "/contents/bad.ipynb", json={"type": "notebook", "content": bad})
    # jupyter_server saves an invalid notebook but says why (it validates on save)
    assert r.status_code == 201, r.text
    assert "Notebook validation failed" in r.json()["message"], r.text
    assert "execution_count" in r.json()["message"], r.text
    log = container_logs(user.container, 200)
    assert "Traceback" not in log and "rfc3987" not in log, log


def workspace(user) -> dict:
    """What JupyterLab keeps of her default workspace on her server."""
    r = requests.get(f"{user.server_url}/lab/api/workspaces/default", headers=user._headers(),
                     timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def recents(user) -> list[str]:
    """The paths her workspace keeps as recently opened documents and folders."""
    return [d["path"] for d in workspace(user).get("docmanager:recents", {}).get("opened", [])]


def test_her_workspace_and_recent_documents_are_kept_when_jupyterlab_loads(lab_user, new_page):
    """The image's JupyterLab neither waits for its workspace's save as it loads nor saves
    the recent documents it has just read (images/singleuser/patch_jupyterlab_load.py:
    ~1 s of every load). Opening a document still saves it in her workspace, and closing
    it too; when she opens JupyterLab again, twice, nothing reopens it (which would add it
    to the list again), "Open Recent" still lists it (read from her workspace, which still
    holds it) and still offers to reopen it."""
    user = lab_user("recents")
    user.start_server()
    r = user.api("PUT", "/contents/notes.txt",
                 json={"type": "file", "format": "text", "content": "kept\n"})
    assert r.status_code == 201, r.text
    page = new_page()
    sign_in_to_lab(page, user.name, user.token)
    page.goto(f"{user.server_url}/lab/tree/notes.txt")
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="notes.txt")
    tab.wait_for()
    wait_for(lambda: "notes.txt" in recents(user), 30, interval=0.5,
             what="JupyterLab to save notes.txt among her recent documents")
    tab.locator(".lm-TabBar-tabCloseIcon").click()
    wait_for(lambda: "editor:notes.txt" not in workspace(user), 30, interval=0.5,
             what="her workspace to be saved without the closed notes.txt")
    for _ in range(2):
        page.goto(f"{user.server_url}/lab")
        page.locator(".jp-Launcher").first.wait_for()  # nothing reopened: the launcher
        assert tab.count() == 0
        page.locator(".lm-MenuBar-itemLabel", has_text="File").click()
        page.locator(".lm-Menu-itemLabel", has_text="Open Recent").hover()
        page.locator(".lm-Menu-itemLabel", has_text="/notes.txt").wait_for()
        # The closed documents are kept too: the menu offers to reopen it.
        page.locator(".lm-Menu-itemLabel", has_text="Reopen notes.txt").wait_for()
        screenshot(page, "jupyterlab-open-recent.png")
        page.keyboard.press("Escape")
        page.keyboard.press("Escape")
    assert "notes.txt" in recents(user)
    bundle = docker("exec", user.container, "sh", "-c",
                    "cat /opt/venv/share/jupyter/lab/static/jlab_core.*.js")
    assert "/*gpulab: loading the workspace does not wait for its save*/" in bundle
    assert "/*gpulab: loading the recent documents saves nothing*/" in bundle


# -- every package as its lock says (docs/operations.md, "Every Python package is locked") --
def locked(lock: str) -> dict[str, str]:
    text = (REPO / lock).read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"^([a-z0-9-]+)===(\S+) ", text, re.M)}


def installed(image: str) -> dict[str, str]:
    """name -> version of every distribution in the image's /opt/venv (read from the
    image, as a member's server would: importlib.metadata, no pip needed)."""
    out = docker("run", "--rm", "--network", "none", "--entrypoint", "/opt/venv/bin/python",
                 image, "-c", "import importlib.metadata as m, json, re; print(json.dumps("
                 "{re.sub(r'[-_.]+', '-', d.metadata['Name']).lower(): d.version "
                 "for d in m.distributions(path=[p for p in __import__('sys').path "
                 "if p.startswith('/opt/venv/')])}))")
    return json.loads(out)


@pytest.mark.parametrize(("image_name", "lock", "own", "removed"), [
    ("gpulab/hub:latest", "images/hub/requirements.lock", {"gpulab"}, {"rfc3987-syntax"}),
    ("gpulab/exporter:latest", "monitoring/exporter/requirements.lock", {"gpulab-exporter"},
     {"pip"}),
    (None, "images/singleuser/requirements-{variant}.lock", set(), {"rfc3987-syntax"}),
])
def test_each_image_holds_exactly_what_its_lock_lists(hub, image, image_name, lock, own,
                                                       removed):
    image_name = image_name or image
    variant = docker("image", "inspect", "-f",
                     '{{index .Config.Labels "org.gpulab.torch-variant"}}', image_name)
    want = locked(lock.format(variant=variant.strip()))
    got = installed(image_name)
    # the venv's own pip and setuptools come with Python's venv, not from a wheelhouse
    extra = {n: v for n, v in got.items()
             if n not in want and n not in own and n not in ("pip", "setuptools")}
    assert extra == {}, f"{image_name} has packages its lock does not list"
    assert {n: got.get(n) for n in want if n not in removed} == \
        {n: v for n, v in want.items() if n not in removed}, image_name
    assert own <= set(got)
