"""JupyterHub's group shares, as gpulab.shares relies on them not being offered: in
JupyterHub 6.1.1 a share with a group gives its members' *user* the access, but none of
their tokens (API tokens, and the OAuth tokens their browsers hold for her server):
``jupyterhub.scopes.get_scopes_for`` adds a token owner's own shares, not her groups'.
Seen on the stack: the group's member opened her server in Chromium and read "403:
Forbidden, user ... is not allowed". So /hub/sharing shares with members only. When this
test fails, an upgrade of JupyterHub fixed it: offer groups on the page again
(templates/sharing.html) and say so in docs/members.md."""

from __future__ import annotations

import tempfile

from jupyterhub import orm, roles, scopes

ACCESS = "access:servers!server=alice/"


def test_a_groups_share_reaches_its_members_but_none_of_their_tokens():
    with tempfile.TemporaryDirectory() as tmp:
        db = orm.new_session_factory(f"sqlite:///{tmp}/jupyterhub.sqlite")()
        for role in roles.get_default_roles():
            roles.create_role(db, role)
        db.add(orm.OAuthClient(identifier="jupyterhub"))  # the hub's own tokens' client
        alice, bob, team = orm.User(name="alice"), orm.User(name="bob"), orm.Group(name="team")
        db.add_all([alice, bob, team])
        db.commit()
        for user in (alice, bob):
            roles.assign_default_roles(db, user)
        team.users.append(bob)
        hers = orm.Spawner(user=alice, name="")
        db.add(hers)
        db.commit()
        orm.Share.grant(db, hers, team)
        token = orm.APIToken.find(db, bob.new_api_token())
        assert ACCESS in scopes.get_scopes_for(bob)  # his user has it ...
        assert ACCESS not in scopes.get_scopes_for(token)  # ... his token does not
        orm.Share.grant(db, hers, bob)  # shared with him by name, it does
        db.expire_all()
        assert ACCESS in scopes.get_scopes_for(token)
        db.close()
        db.get_bind().dispose()
