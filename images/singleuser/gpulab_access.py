"""A member's open websockets close when her access ends, within seconds, and a
colleague's when her share with him ends.

A member's server checks her token with the hub when a request arrives, and a websocket
(a kernel, a terminal, an SSH session or forward through gpulab-ssh, anything under
jupyter-server-proxy) only when it opens. An admin who revokes her last login token, or
ends her access, ends her hub sessions at once (gpulab.login.tokens); without this
module her open kernels, terminals and SSH sessions went on for as long as they stayed
open, and her server answered her token for JupyterHub's cache time (300 s by default).

Here, every open websocket of this server is looked at every :data:`CHECK_EVERY`
seconds: the token it was opened with (the Authorization header, or the server's cookie
that holds her OAuth token) is checked with the hub again, uncached, once per token, and
each websocket whose token the hub no longer accepts is closed with code 1008 (policy
violation) and a reason. The hub being unreachable closes nothing (a hub restart must
not cut members off). jupyter_server_config.py shortens the HTTP token cache to match.

Tornado keeps no list of open websockets: this module wraps
``tornado.websocket.WebSocketHandler.get`` (which every websocket handler's ``get``
ends in) to note each one, weakly. Enabled by
jupyter_server_config.d/gpulab_access.json in the image.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from tornado import ioloop, websocket

CHECK_EVERY = 5.0  # seconds between looks at the open websockets
CLOSE_CODE = 1008  # RFC 6455: policy violation
CLOSE_REASON = "Your access to this server has ended"

log = logging.getLogger(__name__)
_open: weakref.WeakSet = weakref.WeakSet()
_original_get = websocket.WebSocketHandler.get


async def _noted_get(self, *args, **kwargs):
    _open.add(self)
    return await _original_get(self, *args, **kwargs)


def track_websockets() -> None:
    """Note every websocket handler of this process from its upgrade on (idempotent)."""
    websocket.WebSocketHandler.get = _noted_get


def open_websockets() -> list[websocket.WebSocketHandler]:
    return [h for h in list(_open)
            if h.ws_connection is not None and not h.ws_connection.is_closing()]


def by_credential(handlers, hub_auth) -> dict[tuple[str, str], list]:
    """The open websockets grouped by (token, session id) they were opened with; those
    with no token (none should be open) under ("", "")."""
    groups: dict[tuple[str, str], list] = {}
    for handler in handlers:
        try:
            key = (hub_auth.get_token(handler) or "", hub_auth.get_session_id(handler) or "")
        except Exception:  # noqa: BLE001 - a handler in an odd state: check it as tokenless
            key = ("", "")
        groups.setdefault(key, []).append(handler)
    return groups


def still_let_in(hub_auth, model: dict) -> bool:
    """Whether the hub's answer for a token still grants access to this server (an
    ``access:servers`` scope for it: hers, or a colleague's share of it)."""
    access = hub_auth.access_scopes
    return not access or bool(hub_auth.check_scopes(access, model))


async def close_ended(hub_auth) -> int:
    """One look: close every open websocket whose token the hub refuses, or no longer
    lets into this server; how many."""
    closed = 0
    for (token, session), handlers in by_credential(open_websockets(), hub_auth).items():
        if token:
            try:
                model = await hub_auth.user_for_token(token, use_cache=False,
                                                      session_id=session, sync=False)
            except Exception as e:  # noqa: BLE001 - the hub restarting: keep everything
                log.warning("gpulab: could not check open websockets' token with the hub "
                            "(%s); looking again in %.0f s", e, CHECK_EVERY)
                continue
            # still valid, and still letting into this server: a colleague's share that
            # ended (or the server's stop) leaves his token valid but without access here
            if model is not None and still_let_in(hub_auth, model):
                continue
        for handler in handlers:
            log.warning("gpulab: closing websocket %s: the token it was opened with is no "
                        "longer valid (access ended)", handler.request.path)
            handler.close(CLOSE_CODE, CLOSE_REASON)
            closed += 1
    return closed


def _jupyter_server_extension_points():
    return [{"module": "gpulab_access"}]


def _load_jupyter_server_extension(serverapp):
    hub_auth = getattr(serverapp.identity_provider, "hub_auth", None)
    if hub_auth is None:  # not started by JupyterHub: nothing to check against
        serverapp.log.info("gpulab_access: no JupyterHub identity provider; not checking")
        return
    track_websockets()
    running = asyncio.Lock()

    async def look():
        if running.locked():  # a slow hub: never two looks at once
            return
        async with running:
            await close_ended(hub_auth)

    callback = ioloop.PeriodicCallback(look, CHECK_EVERY * 1000)
    callback.start()
    serverapp.log.info("gpulab_access: open websockets are checked with the hub every %.0f s",
                       CHECK_EVERY)
