"""The image's access guard (images/singleuser/gpulab_access.py): which open websockets it
closes. Its hub is JupyterHub's real HubAuth for a server of alice's; only the hub's
answers (the /hub/api/user models) are written here."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import SimpleNamespace

from jupyterhub.services.auth import HubAuth

IMAGE = Path(__file__).resolve().parents[2] / "images" / "singleuser"
spec = importlib.util.spec_from_file_location("gpulab_access", IMAGE / "gpulab_access.py")
access = importlib.util.module_from_spec(spec)
spec.loader.exec_module(access)

HERS = {"name": "alice", "scopes": ["access:servers!server=alice/"]}
SHARED = {"name": "bob", "scopes": ["access:servers!server=alice/"]}
SHARE_ENDED = {"name": "bob", "scopes": ["read:users:name"]}


def her_servers_auth(answers: dict[str, dict | None]) -> HubAuth:
    auth = HubAuth(api_token="x",
                   access_scopes={"access:servers!server=alice/",
                                  "access:servers!user=alice"})

    async def user_for_token(token, use_cache=True, session_id="", sync=True):
        assert use_cache is False  # every look asks the hub again
        return answers[token]

    auth.user_for_token = user_for_token
    auth.get_token = lambda handler: handler.token
    auth.get_session_id = lambda handler: ""
    return auth


class Websocket:
    def __init__(self, token: str):
        self.token, self.closed = token, None
        self.request = SimpleNamespace(path=f"/user/alice/api/kernels/{token}/channels")

    def close(self, code, reason):
        self.closed = (code, reason)


def test_a_colleague_whose_share_ended_is_closed_out_and_the_others_stay():
    """Her own token and a colleague's still shared stay open; a colleague's token that the
    hub still accepts but no longer lets into her server (the share ended), and a token
    the hub refuses (access ended), are closed with 1008."""
    answers = {"hers": HERS, "shared": SHARED, "ended": SHARE_ENDED, "revoked": None}
    sockets = {token: Websocket(token) for token in answers}
    access.open_websockets = lambda: list(sockets.values())
    closed = asyncio.run(access.close_ended(her_servers_auth(answers)))
    assert closed == 2
    assert {t: ws.closed for t, ws in sockets.items()} == {
        "hers": None, "shared": None,
        "ended": (1008, access.CLOSE_REASON), "revoked": (1008, access.CLOSE_REASON)}


def test_the_scope_check_is_jupyterhubs_own():
    auth = her_servers_auth({})
    assert access.still_let_in(auth, HERS) and access.still_let_in(auth, SHARED)
    assert not access.still_let_in(auth, SHARE_ENDED)
    assert not access.still_let_in(auth, {"name": "bob",
                                           "scopes": ["access:servers!server=carol/"]})
