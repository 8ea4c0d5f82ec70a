"""Token login: lab members sign in with their username and a personal access token.

Tokens are JupyterHub API tokens that an admin issued for the member
(``gpulab token issue alice``), so they are stored only as salted hashes in the hub's
database, can expire, and stop working the moment they are revoked. Only tokens
issued for login (their note starts with :data:`LOGIN_TOKEN_NOTE`) are accepted here:
a token a user made for a script cannot be turned into a browser session.
"""

from __future__ import annotations

from jupyterhub import orm
from jupyterhub.auth import Authenticator
from jupyterhub.utils import utcnow
from traitlets import default

LOGIN_TOKEN_NOTE = "gpulab-login"


class TokenAuthenticator(Authenticator):
    """Username + personal access token, checked against the hub's hashed token table."""

    @default("allow_all")
    def _allow_all_default(self):
        # Only holders of an admin-issued token for an existing user get this far.
        return True

    async def authenticate(self, handler, data):
        username = self.normalize_username((data or {}).get("username") or "")
        token = ((data or {}).get("password") or "").strip()
        if not username or not token:
            return None
        orm_token = orm.APIToken.find(handler.db, token, kind="user")
        if (
            orm_token is None
            or orm_token.user is None
            or orm_token.user.name != username
            or not (orm_token.note or "").startswith(LOGIN_TOKEN_NOTE)
        ):
            # Never log the token itself, not even a prefix of it.
            self.log.warning("Failed token login for user %r", username)
            return None
        orm_token.last_activity = utcnow()
        handler.db.commit()
        return {"name": username}
