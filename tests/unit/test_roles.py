"""roles_from_settings and prune_group_members, checked with JupyterHub's own startup
steps on a real hub database file: removing someone from the config removes the right
at the next start."""

from __future__ import annotations

import pytest
from jupyterhub import orm, scopes
from jupyterhub.app import JupyterHub

from gpulab.login.auth import TokenAuthenticator
from gpulab.login.roles import (
    OPERATOR_SCOPES,
    OPERATORS_GROUP,
    OPERATORS_ROLE,
    prune_group_members,
    prune_hub_db,
    roles_from_settings,
)


def test_roles_from_settings_literal():
    admin_users, load_groups, load_roles = roles_from_settings(
        ["Bob", " alice", "alice"], ["carol", "Dave "]
    )
    assert admin_users == {"alice", "bob"}
    assert load_groups == {
        "operators": {
            "users": ["carol", "dave"],
            "properties": {"managed-by": "gpulab.yaml hub.operators"},
        }
    }
    assert load_roles == [
        {"name": "admin", "users": ["alice", "bob"]},
        {
            "name": "gpulab-operators",
            "description": "GPU dashboard and hub metrics for the operators group",
            "scopes": ["access:services!service=gpus", "read:metrics"],
            "groups": ["operators"],
        },
    ]


def test_empty_lists_still_declare_the_exact_membership():
    _, load_groups, load_roles = roles_from_settings([], [])
    assert load_groups[OPERATORS_GROUP]["users"] == []
    assert load_roles[0] == {"name": "admin", "users": []}


@pytest.mark.parametrize("bad", [[""], ["  "], [None], [3]])
def test_bad_names_are_refused_with_the_setting_name(bad):
    with pytest.raises(ValueError, match="hub.operators"):
        roles_from_settings([], bad)


async def start_hub(db_url, throttle_path, admins, operators, prune=True):
    """The startup steps of JupyterHub that load users, groups and roles."""
    config = roles_from_settings(admins, operators)
    if prune:
        prune_hub_db(db_url, config.load_groups)
    app = JupyterHub(db_url=db_url, load_groups=config.load_groups, load_roles=config.load_roles)
    app.authenticator = TokenAuthenticator(throttle_db_path=throttle_path, parent=app)
    app.init_db()
    await app.init_role_creation()
    await app.init_users()
    await app.init_groups()
    await app.init_role_assignment()
    return app


def rights(db, name):
    user = orm.User.find(db, name)
    held = scopes.get_scopes_for(user)
    # an admin holds the unfiltered "access:services", which covers the filtered one
    granted = {s for s in OPERATOR_SCOPES if s in held or s.split("!")[0] in held}
    return {
        "admin": user.admin,
        "admin_role": any(r.name == "admin" for r in user.roles),
        "operators": any(g.name == OPERATORS_GROUP for g in user.groups),
        "operator_scopes": granted == set(OPERATOR_SCOPES),
    }


def stop_hub(app):
    app.db.close()
    app.db.get_bind().dispose()


@pytest.fixture
def hub_files(tmp_path):
    return f"sqlite:///{tmp_path}/jupyterhub.sqlite", str(tmp_path / "throttle.sqlite")


async def test_removal_from_config_revokes_after_restart(hub_files):
    app = await start_hub(*hub_files, admins=["Alice", "bob"], operators=["carol", "bob"])
    assert rights(app.db, "bob") == {
        "admin": True, "admin_role": True, "operators": True, "operator_scopes": True,
    }
    assert rights(app.db, "carol")["operator_scopes"] is True
    assert rights(app.db, "carol")["admin"] is False
    assert orm.Role.find(app.db, OPERATORS_ROLE).groups[0].name == OPERATORS_GROUP
    stop_hub(app)

    app = await start_hub(*hub_files, admins=["alice"], operators=["carol"])
    assert rights(app.db, "bob") == {
        "admin": False, "admin_role": False, "operators": False, "operator_scopes": False,
    }
    assert rights(app.db, "alice")["admin"] is True
    assert rights(app.db, "carol")["operator_scopes"] is True
    stop_hub(app)


async def test_without_pruning_jupyterhub_keeps_removed_group_members(hub_files):
    # Why prune_hub_db exists: load_groups only ever adds.
    app = await start_hub(*hub_files, admins=[], operators=["carol"])
    stop_hub(app)
    app = await start_hub(*hub_files, admins=[], operators=[], prune=False)
    assert rights(app.db, "carol")["operators"] is True
    assert rights(app.db, "carol")["operator_scopes"] is True
    stop_hub(app)


def test_prune_group_members_leaves_other_groups_alone():
    db = orm.new_session_factory("sqlite:///:memory:")()
    users = {n: orm.User(name=n) for n in ("carol", "dave", "erin")}
    db.add_all(users.values())
    db.add(orm.Group(name="operators", users=[users["carol"], users["dave"]]))
    db.add(orm.Group(name="students", users=[users["erin"]]))
    db.commit()
    removed = prune_group_members(
        db, {"operators": {"users": ["Carol"]}, "students": {"properties": {}}}
    )
    assert removed == {"operators": ["dave"]}
    assert [u.name for u in orm.Group.find(db, "operators").users] == ["carol"]
    assert [u.name for u in orm.Group.find(db, "students").users] == ["erin"]
    db.close()


def test_prune_hub_db_does_not_create_a_missing_database(tmp_path):
    path = tmp_path / "jupyterhub.sqlite"
    assert prune_hub_db(f"sqlite:///{path}", {"operators": {"users": []}}) == {}
    assert not path.exists()
