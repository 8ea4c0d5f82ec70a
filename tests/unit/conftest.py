"""Fixtures shared by the unit tests: JupyterHub's real ORM on in-memory sqlite."""

from __future__ import annotations

import pytest

from tests.unit.hub_orm import add_user, new_hub_db


@pytest.fixture
def db():
    session = new_hub_db()
    yield session
    session.close()


@pytest.fixture
def alice(db):
    return add_user(db, "alice")
