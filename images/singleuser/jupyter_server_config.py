# gpulab: users' servers never take a token from a URL (docs/security.md, "Security defaults").
#
# The hub sets JUPYTERHUB_ALLOW_TOKEN_IN_URL=0 for every server, and JupyterHub then
# ignores ?token= ... except on requests whose Sec-Fetch-Mode header says "websocket"
# (HubAuth._get_token_url). Any client can send that header on any request, so
# `curl -H 'Sec-Fetch-Mode: websocket' /user/NAME/lab?token=...` signed in with a URL
# token. Nothing here needs the exception: browsers send the server's cookie with
# websockets and scripts send an Authorization header. This file is in the image's
# /opt/venv/etc/jupyter, which jupyterhub-singleuser reads at start; it replaces only
# that one lookup, and tests/integration/test_claims.py checks it on the real stack.
import os
import sys

from jupyterhub.services.auth import HubAuth


def _no_token_from_the_url(self, handler):
    return ""


HubAuth._get_token_url = _no_token_from_the_url


# A full home said clearly when JupyterLab saves, instead of "Unexpected error while saving
# file" (gpulab_home_full.py): jupyter_server's own contents manager, with that one change.
c.ServerApp.contents_manager_class = "gpulab_home_full.HomeFullContentsManager"  # noqa: F821
# ... and a server that can start on a full home (its member can then make room): in a
# server the hub started, not wherever this file is read.
if os.environ.get("JUPYTERHUB_API_TOKEN"):
    from gpulab_home_full import mark_configuration_migrated
    from jupyter_core.paths import jupyter_config_dir

    mark_configuration_migrated(jupyter_config_dir())

    # A member's first `%pip install` importable in the same kernel, at once: Python puts
    # the user site (~/.local/lib/python3.11/site-packages, where pip installs for her)
    # on a kernel's sys.path only if that folder exists when the kernel starts, and in a
    # new home it does not (seen: ModuleNotFoundError until her server restarted).
    import site

    try:
        os.makedirs(site.getusersitepackages(), exist_ok=True)
    except OSError:  # a full home: nothing can be installed into it either
        pass


# Behind HTTPS (the hub passes its public URL: docker-compose.https.yml), the server's
# XSRF cookie is Secure like the hub's own cookies; tornado cannot tell by itself.
if os.environ.get("JUPYTERHUB_PUBLIC_URL", "").startswith("https://"):
    # a plain dict: jupyterhub-singleuser reads this setting as one at start
    c.ServerApp.tornado_settings = {"xsrf_cookie_kwargs": {"secure": True}}  # noqa: F821


# TensorBoard and the GPU panel, as cards in JupyterLab's launcher (docs/members.md, "What the
# image carries"). jupyter-server-proxy starts each one when it is first opened and
# proxies it under the server's URL, behind the hub's sign-in like the rest of it:
# /user/NAME/tensorboard/ (a browser tab) and /user/NAME/gpus/ (a JupyterLab tab).
# Both are in the launcher's first row ("Notebook", jupyter-server-proxy's default): its
# icons reach JupyterLab as kernel icons, which JupyterLab's launcher draws only in the
# Notebook and Console rows (jupyter-server-proxy 4.6.0; upstream PR #606 is open). Under
# "Other" the cards were blank squares.
ICONS = "/opt/venv/share/gpulab/icons"


def _tensorboard_command(port):
    """TensorBoard on ~/runs: where torch.utils.tensorboard's SummaryWriter() writes by
    default from a notebook in the home folder (runs/DATE_HOST); made if missing."""
    logdir = os.path.expanduser("~/runs")
    os.makedirs(logdir, exist_ok=True)
    return [sys.executable, "-m", "tensorboard.main", "--logdir", logdir,
            "--host", "127.0.0.1", "--port", str(port)]


c.ServerProxy.servers = {  # noqa: F821
    "tensorboard": {
        "command": _tensorboard_command,
        "timeout": 60,  # its first start imports a lot (seconds on a busy 2-core host)
        "launcher_entry": {"title": "TensorBoard", "category": "Notebook",
                           "icon_path": f"{ICONS}/tensorboard.svg"},
        "new_browser_tab": True,
    },
    "gpus": {
        "command": [sys.executable, "-m", "gpulab_gpus", "--port", "{port}"],
        "timeout": 20,
        "launcher_entry": {"title": "GPUs", "category": "Notebook",
                           "icon_path": f"{ICONS}/gpus.svg"},
        "new_browser_tab": False,
    },
}
