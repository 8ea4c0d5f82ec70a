# gpulab: users' servers never take a token from a URL (README, "Security defaults").
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

from jupyterhub.services.auth import HubAuth


def _no_token_from_the_url(self, handler):
    return ""


HubAuth._get_token_url = _no_token_from_the_url


# Behind HTTPS (the hub passes its public URL: docker-compose.https.yml), the server's
# XSRF cookie is Secure like the hub's own cookies; tornado cannot tell by itself.
if os.environ.get("JUPYTERHUB_PUBLIC_URL", "").startswith("https://"):
    # a plain dict: jupyterhub-singleuser reads this setting as one at start
    c.ServerApp.tornado_settings = {"xsrf_cookie_kwargs": {"secure": True}}  # noqa: F821
