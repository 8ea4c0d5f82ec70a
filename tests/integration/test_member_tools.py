"""What a lab member finds in JupyterLab beside PyTorch, used as a member uses it.

The single-user image carries matplotlib, ipywidgets, git, TensorBoard and a GPU panel;
the last two are cards in JupyterLab's launcher, started on first use and proxied
under the member's server URL by jupyter-server-proxy (images/singleuser/
jupyter_server_config.py, gpulab_gpus.py). The test stack has no real GPU: a member
without a GPU, and one whose server holds a stand-in GPU (NVIDIA_VISIBLE_DEVICES names
a UUID, but no driver is injected, so NVML fails), must both read in words why the
panel shows no GPU.
"""

from __future__ import annotations

import re

import pytest
import requests

from .browser import run_in_new_notebook, screenshot, sign_in_to_lab
from .stack import container_logs
from .standin import GPU0, GPU1

pytestmark = pytest.mark.integration

NO_GPU_ASSIGNED = "No GPU assigned to this server."


def launcher_card(page, title: str):
    """Her launcher's card for *title*, checked to show its icon, an image her browser
    loaded (in the launcher's "Other" row JupyterLab drew none: blank squares)."""
    card = page.locator(".jp-LauncherCard", has_text=title).first
    icon = card.locator("img.jp-Launcher-kernelIcon")
    icon.wait_for()
    page.wait_for_function("i => i.complete && i.naturalWidth > 0", arg=icon.element_handle(),
                           timeout=10_000)
    return card


def test_the_gpu_panel_says_that_no_gpu_is_assigned(lab_user, new_page):
    from playwright.sync_api import expect

    alice = lab_user("gpupanel")
    alice.start_server()
    page = new_page()
    sign_in_to_lab(page, alice.name, alice.token)
    launcher_card(page, "GPUs").click()
    # a JupyterLab tab (not a browser tab) framing /user/NAME/gpus/
    tab = page.locator(".lm-TabBar-tab", has_text="GPUs")
    tab.first.wait_for(state="visible")
    panel = page.frame_locator(f'iframe[src*="/user/{alice.name}/gpus/"]')
    message = panel.locator("#gpulab-gpu-message")
    # (redrawn every 2 s: a refresh whose fetch failed says so for one round)
    expect(message).to_contain_text(NO_GPU_ASSIGNED, timeout=30_000)
    text = message.inner_text()
    assert text.startswith(NO_GPU_ASSIGNED), text
    assert "Hub Control Panel" in text, text
    screenshot(page, "gpu-panel-no-gpu.png")
    log = container_logs(alice.container, 200)
    assert "Traceback" not in log, log


def test_tensorboard_opens_from_the_launcher_on_the_members_runs(lab_user, new_page):
    alice = lab_user("tensorboard")
    alice.start_server()
    # what a training notebook in the home folder writes (SummaryWriter's ./runs)
    out = alice.run_code(
        "import os\nfrom torch.utils.tensorboard import SummaryWriter\nos.chdir(os.path.expanduser('~'))\n"
        "w = SummaryWriter('runs/first-try')\n"
        "for step in range(5): w.add_scalar('loss', 1.0 / (step + 1), step)\n"
        "w.close(); print('written')")
    assert out.strip() == "written", out

    page = new_page()
    sign_in_to_lab(page, alice.name, alice.token)
    with page.context.expect_page(timeout=60_000) as opened:
        launcher_card(page, "TensorBoard").click()
    board = opened.value
    board.wait_for_url(re.compile(rf"/user/{re.escape(alice.name)}/tensorboard/"), timeout=90_000)
    board.wait_for_function("document.title === 'TensorBoard'", timeout=60_000)
    # the run and its scalar, read through the hub's proxy and the server's
    board.get_by_text("first-try").first.wait_for(state="visible", timeout=90_000)
    board.get_by_text("loss").first.wait_for(state="visible", timeout=60_000)
    screenshot(board, "tensorboard-from-launcher.png")


LAB_CELL = """import matplotlib.pyplot as plt, ipywidgets
plt.plot([1, 3, 2]); plt.title("gpulab"); plt.show()
display(ipywidgets.IntSlider(value=7, description="epochs"))
!git --version"""


def test_a_notebook_plots_shows_a_widget_and_runs_git(lab_user, new_page):
    alice = lab_user("notebook")
    alice.start_server()
    page = new_page()
    sign_in_to_lab(page, alice.name, alice.token)
    run_in_new_notebook(page, LAB_CELL, "git version 2.")
    outputs = page.locator(".jp-NotebookPanel .jp-OutputArea").first
    image = outputs.locator(".jp-RenderedImage img").first
    image.wait_for(state="visible")
    assert image.evaluate("img => img.naturalWidth") > 100
    slider = outputs.locator(".widget-slider").first
    slider.wait_for(state="visible")
    assert "epochs" in slider.inner_text() and "7" in slider.inner_text(), slider.inner_text()
    screenshot(page, "notebook-plot-widget-git.png")


# Last: the stand-in inventory (gpus_yaml) puts a GPU form on the spawn page for the
# rest of this module.
def test_the_gpu_panel_says_why_a_stand_in_gpu_is_not_reachable(lab_user, gpus_yaml):
    """A server that leased a GPU on a host without one: the panel names the GPU it
    was given and says that the driver could not be used, instead of failing."""
    bob = lab_user("gpupanel")
    bob.start_server({"gpus": 1})
    r = requests.get(f"{bob.server_url}/gpus/gpus.json",
                     headers={"Authorization": f"token {bob.token}"}, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["gpus"] == [] and len(data["assigned"]) == 1, data
    assert data["assigned"][0] in (GPU0, GPU1), data
    assert data["message"].startswith("No GPU is reachable from this server"), data
    assert data["assigned"][0] in data["message"] and "NVML" in data["message"], data
