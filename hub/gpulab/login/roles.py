"""Admins and operators from gpulab.yaml, as JupyterHub groups and roles.

What JupyterHub 6.1 does with each setting at startup (app.py ``init_groups``,
``init_role_assignment``):

* ``Authenticator.admin_users`` only *adds* admins; removing a name does not revoke
  anything. An ``admin`` entry in ``load_roles`` with a ``users`` list is exact
  instead: whoever is not listed loses the admin role and ``admin=True`` at the next
  start. :func:`roles_from_settings` uses that, so ``admin_users`` must stay empty
  (setting both makes JupyterHub merge them and warn at every start).
* ``load_roles`` membership lists (``users``, ``groups``) are exact: a role loses
  members that are no longer listed.
* ``load_groups`` only *adds* users to groups. So a user removed from ``operators``
  in the config would stay in the group, and keep the operators role through it.
  :func:`prune_group_members` removes such users; run it before JupyterHub loads
  the groups (:func:`prune_hub_db` does it from the config file, on the hub
  database, before the hub opens it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from gpulab import compat
from gpulab.contract import DASHBOARD_SERVICE

OPERATORS_GROUP = "operators"
OPERATORS_ROLE = "gpulab-operators"
OPERATOR_SCOPES = (f"access:services!service={DASHBOARD_SERVICE}", "read:metrics")

log = logging.getLogger(__name__)


class RoleConfig(NamedTuple):
    """Values for ``c.Authenticator.admin_users``, ``c.JupyterHub.load_groups`` and
    ``c.JupyterHub.load_roles``."""

    admin_users: set[str]
    load_groups: dict[str, dict]
    load_roles: list[dict]


def _normalise(names: Iterable[str], what: str) -> list[str]:
    out = []
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{what}: expected a username, got {name!r}")
        norm = name.strip().lower()
        if norm not in out:
            out.append(norm)
    return sorted(out)


def roles_from_settings(admins: Iterable[str], operators: Iterable[str]) -> RoleConfig:
    """Turn ``hub.admins`` and ``hub.operators`` into JupyterHub groups and roles.

    The returned ``admin_users`` is the normalised admin list for reference (e.g. the
    CLI's bootstrap); do not assign it to ``c.Authenticator.admin_users``: the
    ``admin`` role below is the exact, revoking list.

    Operators are the members of the ``operators`` group, which holds the
    ``gpulab-operators`` role: the GPU dashboard service and hub metrics.
    """
    admin_list = _normalise(admins, "hub.admins")
    operator_list = _normalise(operators, "hub.operators")
    load_groups = {
        OPERATORS_GROUP: {
            "users": operator_list,
            "properties": {"managed-by": "gpulab.yaml hub.operators"},
        }
    }
    load_roles = [
        {
            # only membership: JupyterHub refuses to change the admin role's
            # description or scopes
            "name": "admin",
            "users": admin_list,
        },
        {
            "name": OPERATORS_ROLE,
            "description": "GPU dashboard and hub metrics for the operators group",
            "scopes": list(OPERATOR_SCOPES),
            "groups": [OPERATORS_GROUP],
        },
    ]
    return RoleConfig(set(admin_list), load_groups, load_roles)


def prune_group_members(db, load_groups: dict[str, dict]) -> dict[str, list[str]]:
    """Remove users from each configured group who are no longer listed in its config.

    *db* is a SQLAlchemy session on the hub database. Groups without a ``users``
    list, and groups not in *load_groups*, are left alone. Returns
    ``{group: [removed usernames]}`` for the groups that changed.
    """
    orm = compat.hub_orm()

    removed: dict[str, list[str]] = {}
    for name, spec in load_groups.items():
        if not isinstance(spec, dict) or "users" not in spec:
            continue
        group = orm.Group.find(db, name)
        if group is None:
            continue
        wanted = {u.strip().lower() for u in spec["users"]}
        stale = [u for u in group.users if u.name not in wanted]
        for user in stale:
            group.users.remove(user)
        if stale:
            removed[name] = sorted(u.name for u in stale)
    db.commit()
    return removed


def prune_hub_db(db_url: str, load_groups: dict[str, dict]) -> dict[str, list[str]]:
    """:func:`prune_group_members` on the hub database at *db_url*, before the hub starts.

    Call it from the hub config (it runs before JupyterHub opens the database). A
    sqlite database that does not exist yet (first start) is left for JupyterHub to
    create. A database whose schema needs ``jupyterhub upgrade-db`` is skipped with a
    warning: JupyterHub itself then refuses to start with the same advice.
    """
    orm = compat.hub_orm()

    match = re.match(r"sqlite:///(.+)", db_url)
    if match and match.group(1) != ":memory:" and not Path(match.group(1)).exists():
        return {}
    try:
        session_factory = orm.new_session_factory(db_url)
    except orm.DatabaseSchemaMismatch as e:
        log.warning("gpulab: not pruning group members, the hub database needs upgrading: %s", e)
        return {}
    db = session_factory()
    try:
        removed = prune_group_members(db, load_groups)
    finally:
        db.close()
        db.get_bind().dispose()
    for group, users in removed.items():
        log.warning("gpulab: removed %s from group %r (no longer in the config)", users, group)
    return removed
