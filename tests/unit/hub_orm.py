"""JupyterHub's real ORM on an in-memory sqlite database, for the login tests. The
fixtures ``db`` and ``alice`` are in tests/unit/conftest.py."""

from __future__ import annotations

from jupyterhub import orm


def new_hub_db():
    session = orm.new_session_factory("sqlite:///:memory:")()
    session.add(orm.OAuthClient(identifier="jupyterhub"))
    session.commit()
    return session


def add_user(db, name: str) -> orm.User:
    user = orm.User(name=name)
    db.add(user)
    db.commit()
    return user
