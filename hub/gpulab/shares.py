"""A member's server shared with a colleague: JupyterHub's shares, switched on, and ended
when what they rest on ends.

JupyterHub (5 and later) lets a member grant another member access to one of her servers
(``POST /hub/api/shares/NAME/SERVER``). Not a group: in 6.1.1 a group's share reaches
none of its members' tokens, so her server would refuse them (tests/unit/test_shares.py);
members are not given what JupyterHub asks for one (``read:groups:name``). The colleague
opens ``/user/NAME/SERVER/`` signed in as himself, with JupyterHub's default share scope,
``access:servers!server=NAME/SERVER``: that server, nothing else of hers (no tokens, no
start or stop, no SSH: gpulab-ssh only ever asks for its member's own servers).
docs/members.md, "Share your server", says what a member does.

gpulab adds:

* the page ``/hub/sharing``, where she shares a running server by a colleague's name,
  sees and ends her shares, and sees the servers shared with her;
* the end of every share of a server when the server stops (JupyterHub keeps shares until
  the server is deleted): a share is for one sitting, not for whatever she runs next;
* the end of every share to or from a member whose access ends
  (gpulab.login.tokens' ``end_access``).

Her colleague's open websockets in her server close within seconds of any of these, as
her own do when her access ends (images/singleuser/gpulab_access.py checks each token's
access to the server, not only that it is valid).
"""

from __future__ import annotations

from jupyterhub.handlers import BaseHandler
from tornado import web

from gpulab import compat

#: What a member's ``user`` role gains when hub.sharing is on: share her own servers, and
#: look up a colleague's name (JupyterHub asks for that before it shares with him by name;
#: it shows a name only, never who else exists: listing needs list:users). Not
#: read:groups:name: without it JupyterHub refuses a share with a group (a 403), which
#: would open nothing anyway (above).
MEMBER_SCOPES = ("shares!user", "read:users:name")


def end_server_shares(db, orm_spawner) -> int:
    """Delete every share and share code of one server (it stopped); how many."""
    orm = compat.hub_orm()
    rows = [*db.query(orm.Share).filter_by(spawner_id=orm_spawner.id),
            *db.query(orm.ShareCode).filter_by(spawner_id=orm_spawner.id)]
    return _delete(db, rows)


def end_member_shares(db, orm_user) -> int:
    """Delete every share given to *orm_user*, and every share and share code of her
    servers (her access ended); how many."""
    orm = compat.hub_orm()
    rows = [*db.query(orm.Share).filter_by(user_id=orm_user.id),
            *db.query(orm.Share).filter_by(owner_id=orm_user.id),
            *db.query(orm.ShareCode).filter_by(owner_id=orm_user.id)]
    return _delete(db, rows)


def _delete(db, rows) -> int:
    unique = set(rows)  # the session gives one object per row, whichever query found it
    for row in unique:
        db.delete(row)
    if unique:
        db.commit()
    return len(unique)


class SharingPageHandler(BaseHandler):
    """``/hub/sharing``: her running servers with their shares, a form to share each, and
    the servers shared with her, all through JupyterHub's own share API (with the page's
    XSRF token)."""

    @web.authenticated
    async def get(self):
        user = self.current_user
        running = [(name, user.server_url(name)) for name, spawner
                   in sorted(user.spawners.items()) if spawner.ready]
        allowed = self.has_scope(f"shares!user={user.name}")  # hub.sharing on
        self.finish(await self.render_template("sharing.html", user=user, running=running,
                                               allowed=allowed))


def page_handlers() -> list[tuple[str, type]]:
    return [(r"/sharing", SharingPageHandler)]
