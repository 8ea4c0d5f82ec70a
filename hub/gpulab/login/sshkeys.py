"""Members' SSH public keys, registered at the hub, that sign in to gpulab-ssh.

Why at the hub and not in ``~/.ssh/authorized_keys`` in her home: whatever a member runs
in her server (a notebook, a package she installed) can write her home, so a key put
there would let whoever wrote it in, and keep letting them in after an admin ended her
access. The hub is where access is given and ended: a key signs in only while its owner
has a valid login token (her access), ending her access removes her keys, and only a
request made with her *login token* (or an admin's) may add one, never a token her
server holds.

How a key sign-in works: gpulab-ssh, as the hub service ``gpulab-ssh`` (its token in
``secrets/ssh-gateway-token``), asks ``POST /hub/api/gpulab/ssh-sign-in`` first whether
the key a client offers is hers (``"check": true``), then, once asyncssh has checked that
the client holds the private key (its signature), for a token that may only
reach and see her own server, for this connection; it deletes that token when the
connection ends. What the gateway can do with its service token is exactly that: so
whoever took over the gateway could reach the servers of members who registered keys,
never their hub accounts and never an admin's powers (docs/security.md#ssh-keys).

REST API (under ``/hub/api/gpulab/``):

* ``GET    ssh-keys/{user}``: 200 ``{"ssh_keys": [model...]}``;
* ``POST   ssh-keys/{user}`` body ``{"key": "ssh-ed25519 AAAA... comment"}``: 201, the
  model; 400 for what is not an acceptable public key (with why), 409 if it is there;
* ``DELETE ssh-keys/{user}/{id}``: 200.

The member herself with her login token, or an admin; the gateway's endpoint only for
the ``gpulab-ssh`` service.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from jupyterhub import orm
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.utils import isoformat
from tornado import web

from gpulab import compat, private_db
from gpulab.login import tokens as lt

SSH_SERVICE = "gpulab-ssh"  # the hub service the SSH gateway signs in as
MAX_KEYS = 10  # per member
MAX_KEY_TEXT = 16_384  # characters of one public key line (RSA 16384 bits fits)
MIN_RSA_BITS = 2048
KEY_TOKEN_NOTE = "gpulab-ssh: key sign-in"  # prefix; the fingerprint follows
KEY_TOKEN_SECONDS = 7 * 86400  # a key sign-in's token, if the gateway cannot delete it
ALGORITHMS = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
              "ecdsa-sha2-nistp521", "ssh-rsa", "sk-ssh-ed25519@openssh.com",
              "sk-ecdsa-sha2-nistp256@openssh.com")


class BadKey(ValueError):
    """Not a public key gpulab takes; the message says why, for the member."""


@dataclass(frozen=True)
class PublicKey:
    algorithm: str
    line: str  # "ALGORITHM BASE64", without the comment: what is compared
    fingerprint: str  # "SHA256:...", as ssh-keygen -l shows it
    comment: str


def parse_public_key(text: str) -> PublicKey:
    """The public key in *text* (one line of an ``id_*.pub`` file), or BadKey."""
    import asyncssh  # here: the hub imports this module, asyncssh only when it is used

    text = (text or "").strip()
    if "PRIVATE KEY" in text:
        raise BadKey("That is a private key: never paste it anywhere. Paste the public "
                     "key, the line in the file that ends in .pub (e.g. ~/.ssh/id_ed25519.pub).")
    if not text:
        raise BadKey("No key given: paste the line of your ~/.ssh/id_ed25519.pub")
    if len(text) > MAX_KEY_TEXT or "\n" in text:
        raise BadKey("One public key, on one line, is expected (the line of your .pub file)")
    try:
        key = asyncssh.import_public_key(text)
    except (asyncssh.KeyImportError, ValueError) as e:
        raise BadKey(f"Not an OpenSSH public key ({e}); paste the line of your "
                     "~/.ssh/id_ed25519.pub (make one with ssh-keygen -t ed25519)") from None
    algorithm = key.get_algorithm()
    if algorithm not in ALGORITHMS:
        raise BadKey(f"{algorithm} keys are not accepted; use ed25519 "
                     "(ssh-keygen -t ed25519), ECDSA or RSA of 2048 bits or more")
    bits = getattr(getattr(key, "pyca_key", None), "key_size", None)
    if algorithm == "ssh-rsa" and bits is not None and bits < MIN_RSA_BITS:
        raise BadKey(f"This RSA key has {bits} bits; {MIN_RSA_BITS} or more are needed "
                     "(or use ssh-keygen -t ed25519)")
    line = key.export_public_key("openssh").decode().split()[:2]
    comment = key.get_comment() or ""
    return PublicKey(algorithm, " ".join(line), key.get_fingerprint("sha256"),
                     comment[:200])


_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS ssh_keys (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        username TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        key TEXT NOT NULL,          -- "ALGORITHM BASE64": public
        comment TEXT NOT NULL,
        added_by TEXT NOT NULL,
        added_at REAL NOT NULL,
        last_used REAL,
        UNIQUE (username, fingerprint)
    )""",
)


class SshKeyStore:
    """Which public keys are whose: a sqlite file next to the hub database (mode 0600)."""

    def __init__(self, path: str | os.PathLike, *, now: Callable[[], float] = time.time):
        self.path = private_db.create(path, _SCHEMA)
        self.now = now

    def _connect(self) -> sqlite3.Connection:
        db = private_db.connect(self.path)
        db.row_factory = sqlite3.Row
        return db

    def keys(self, username: str) -> list[dict]:
        with self._connect() as db:
            return [dict(r) for r in db.execute(
                "SELECT * FROM ssh_keys WHERE username = ? ORDER BY id", (username,))]

    def add(self, username: str, key: PublicKey, added_by: str) -> dict:
        """Record *key* for *username*; ValueError if she has it or has MAX_KEYS."""
        with self._connect() as db:
            count = db.execute("SELECT COUNT(*) FROM ssh_keys WHERE username = ?",
                               (username,)).fetchone()[0]
            if count >= MAX_KEYS:
                raise ValueError(f"{username} has {count} SSH keys, the most one may have; "
                                 "remove one first")
            try:
                cur = db.execute(
                    "INSERT INTO ssh_keys (username, fingerprint, key, comment, added_by,"
                    " added_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (username, key.fingerprint, key.line, key.comment, added_by, self.now()))
            except sqlite3.IntegrityError:
                raise KeyError(key.fingerprint) from None
            return dict(db.execute("SELECT * FROM ssh_keys WHERE id = ?",
                                   (cur.lastrowid,)).fetchone())

    def find(self, username: str, key: PublicKey) -> dict | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM ssh_keys WHERE username = ? AND fingerprint = ?"
                             " AND key = ?", (username, key.fingerprint, key.line)).fetchone()
        return dict(row) if row else None

    def used(self, key_id: int) -> None:
        with self._connect() as db:
            db.execute("UPDATE ssh_keys SET last_used = ? WHERE id = ?", (self.now(), key_id))

    def remove(self, username: str, key_id: int) -> bool:
        with self._connect() as db:
            return db.execute("DELETE FROM ssh_keys WHERE username = ? AND id = ?",
                              (username, key_id)).rowcount > 0

    def forget_user(self, username: str) -> int:
        with self._connect() as db:
            return db.execute("DELETE FROM ssh_keys WHERE username = ?", (username,)).rowcount


def key_model(row: dict) -> dict:
    def when(t):
        return isoformat(datetime.fromtimestamp(t, UTC)) if t else None
    return {"id": row["id"], "user": row["username"], "fingerprint": row["fingerprint"],
            "key": row["key"], "comment": row["comment"], "added_by": row["added_by"],
            "added": when(row["added_at"]), "last_used": when(row["last_used"])}


def key_token_scopes(name: str, server: str = "") -> list[str]:
    """What a key sign-in's token may do: reach and see her own *server* ("" her default
    one; ``ssh alice+train@`` names ``train``)."""
    return [f"access:servers!server={name}/{server}", f"read:servers!server={name}/{server}",
            f"read:users:name!user={name}"]


def is_key_token(name: str, scopes) -> bool:
    """Whether *scopes* are exactly a key sign-in token's, for one of *name*'s servers."""
    prefix = f"access:servers!server={name}/"
    server = next((s[len(prefix):] for s in scopes if s.startswith(prefix)), None)
    return server is not None and set(scopes) == set(key_token_scopes(name, server))


# ------------------------------------------------------------------ REST API


class _SshKeys(lt.LoginTokenAPIBase):
    @property
    def ssh_keys(self) -> SshKeyStore:
        store = getattr(self.authenticator, "ssh_keys", None)
        if not isinstance(store, SshKeyStore):
            raise web.HTTPError(500, "SSH keys need c.JupyterHub.authenticator_class = "
                                     "'gpulab-token'")
        return store

    def require_owner_or_admin(self, user_name: str):
        """The member herself, with her login token in the request or signed in in her
        browser (the /hub/ssh-keys page, with the page's XSRF token), or an admin."""
        if self.current_user is None:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        if all(self.has_scope(s) for s in lt.ADMIN_SCOPES):
            return self.user_or_404(user_name)
        token = self.get_token()
        if (getattr(self.current_user, "kind", "user") == "user"
                and self.current_user.name == user_name
                and (lt.is_login_token(self.store, token) if token is not None
                     else compat.cookie_authenticated(self))):
            return self.user_or_404(user_name)
        raise web.HTTPError(403, "Only the member (with her login token, or signed in in "
                                 "her browser) or an admin may manage her SSH keys (a "
                                 "server's own token may not).")


class SshKeysAPIHandler(_SshKeys):
    """``GET`` (list) and ``POST`` (add) ``/hub/api/gpulab/ssh-keys/{user}``."""

    def get(self, user_name):
        user = self.require_owner_or_admin(user_name)
        self.write(json.dumps({"ssh_keys": [key_model(r)
                                            for r in self.ssh_keys.keys(user.name)]}))

    def post(self, user_name):
        user = self.require_owner_or_admin(user_name)
        body = self.get_json_body() or {}
        if not isinstance(body, dict) or set(body) != {"key"} or not isinstance(
                body["key"], str):
            raise web.HTTPError(400, 'Body must be {"key": "<the line of your .pub file>"}')
        try:
            key = parse_public_key(body["key"])
            row = self.ssh_keys.add(user.name, key, self.requester)
        except BadKey as e:
            raise web.HTTPError(400, str(e)) from None
        except KeyError:
            raise web.HTTPError(409, f"{user.name} has this key already "
                                     f"({key.fingerprint})") from None
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None
        self.log.info("%s added SSH key %s (%s) for %s", self.requester, key.fingerprint,
                      key.algorithm, user.name)
        self.set_status(201)
        self.write(json.dumps(key_model(row)))


class SshKeyAPIHandler(_SshKeys):
    """``DELETE /hub/api/gpulab/ssh-keys/{user}/{id}``: remove one."""

    def delete(self, user_name, key_id):
        user = self.require_owner_or_admin(user_name)
        if not key_id.isdecimal() or not self.ssh_keys.remove(user.name, int(key_id)):
            raise web.HTTPError(404, f"{user.name} has no SSH key {key_id}")
        self.log.info("%s removed SSH key %s of %s", self.requester, key_id, user.name)
        self.write(json.dumps({"removed": int(key_id)}))


class SshSignInAPIHandler(_SshKeys):
    """``POST /hub/api/gpulab/ssh-sign-in`` (the gpulab-ssh service only), body
    ``{"user": name, "key": "ALGORITHM BASE64", "check": bool, "server": name?}``: 200
    ``{"user"}`` when the key is the member's and she has access (with *check*), else 201
    with a token of hers for this connection to her *server* (:func:`key_token_scopes`);
    403 with why not.
    ``DELETE /hub/api/gpulab/ssh-sign-in`` body ``{"user", "token_id"}``: the
    connection ended, its token goes (only such a token)."""

    def require_gateway(self) -> dict:
        who = self.current_user
        if who is None or getattr(who, "kind", None) != "service" or who.name != SSH_SERVICE:
            raise web.HTTPError(403, f"Only the {SSH_SERVICE} service may do this.")
        body = self.get_json_body() or {}
        if not isinstance(body, dict) or not isinstance(body.get("user"), str):
            raise web.HTTPError(400, 'Body must name the "user"')
        return body

    async def post(self):
        body = self.require_gateway()
        if not isinstance(body.get("key"), str):
            raise web.HTTPError(400, 'Body must give the "key"')
        try:
            key = parse_public_key(body["key"])
        except BadKey as e:
            raise web.HTTPError(400, str(e)) from None
        user = self.find_user(body["user"])
        row = self.ssh_keys.find(user.name, key) if user is not None else None
        if row is None:
            raise web.HTTPError(403, "not a key of this user")
        if not (lt.login_tokens(self.db, self.store, user.orm_user)
                or await self.authenticator.vouched_by_provider(user, self)):
            raise web.HTTPError(403, f"{user.name} has no access (no valid login token, "
                                     "and the lab's sign-in does not vouch for her): her "
                                     "keys sign in again once she has access")
        if body.get("check"):
            self.write(json.dumps({"user": user.name}))
            return
        server = body.get("server", "")
        if not isinstance(server, str) or "/" in server or len(server) > 255:
            raise web.HTTPError(400, '"server" must be the name of one of her servers')
        token = user.orm_user.new_api_token(
            scopes=key_token_scopes(user.name, server), expires_in=KEY_TOKEN_SECONDS,
            note=f"{KEY_TOKEN_NOTE} {key.fingerprint}")
        orm_token = orm.APIToken.find(self.db, token, kind="user")
        self.ssh_keys.used(row["id"])
        self.log.info("ssh sign-in of %s with key %s", user.name, key.fingerprint)
        self.set_status(201)
        self.write(json.dumps({"user": user.name, "token": token, "id": orm_token.api_id}))

    def delete(self):
        body = self.require_gateway()
        user = self.find_user(body["user"])
        token_id = body.get("token_id")
        found = None
        if user is not None and isinstance(token_id, str):
            found = next((t for t in lt.user_tokens(self.db, user.orm_user)
                          if t.api_id == token_id
                          and (t.note or "").startswith(KEY_TOKEN_NOTE)
                          and is_key_token(user.name, t.scopes)
                          and not self.store.is_recorded(t)
                          and not self.store.is_recorded(t, lt.KIND_API)), None)
        if found is None:
            raise web.HTTPError(404, "no such key sign-in token")
        self.db.delete(found)
        self.db.commit()
        self.write(json.dumps({"deleted": token_id}))


class SshKeysPageHandler(BaseHandler):
    """``/hub/ssh-keys``: her keys, and the form to add one, through the REST API above
    (with the page's XSRF token): how a member who signs in with the lab's identity
    provider, and has no login token, registers a key."""

    @web.authenticated
    async def get(self):
        self.finish(await self.render_template("ssh_keys.html", user=self.current_user))


def api_handlers() -> list[tuple[str, type]]:
    return [
        (r"/api/gpulab/ssh-keys/([^/]+)", SshKeysAPIHandler),
        (r"/api/gpulab/ssh-keys/([^/]+)/([^/]+)", SshKeyAPIHandler),
        (r"/api/gpulab/ssh-sign-in", SshSignInAPIHandler),
        (r"/ssh-keys", SshKeysPageHandler),
    ]
