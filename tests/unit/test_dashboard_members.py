"""gpulab.dashboard.members: what an admin's members form may send, and what the page shows."""

from __future__ import annotations

import pytest

from gpulab.dashboard.members import Issue, MemberError, members_model, parse_issue, parse_revoke


@pytest.mark.parametrize("body, issue", [
    ({"name": "alice"}, Issue("alice", 90 * 86400)),
    ({"name": " bob ", "expires": "12h"}, Issue("bob", 12 * 3600)),
    ({"name": "carol.d", "expires": "0"}, Issue("carol.d", None)),
    ({"name": "dan_1", "expires": "never"}, Issue("dan_1", None)),
    ({"name": "eve", "expires": ""}, Issue("eve", 90 * 86400)),
])
def test_issue_requests_that_are_fine(body, issue):
    assert parse_issue(body) == issue


@pytest.mark.parametrize("body, message", [
    (None, 'Send JSON {"name"'),
    ([], 'Send JSON {"name"'),
    ({"name": 7}, 'Send JSON {"name"'),
    ({"name": ""}, "is not a member name"),
    ({"name": "Alice"}, "is not a member name"),
    ({"name": "a/b"}, "is not a member name"),
    ({"name": "-x"}, "is not a member name"),
    ({"name": "x" * 64}, "is not a member name"),
    ({"name": "alice", "expires": 5}, "expires: a lifetime"),
    ({"name": "alice", "expires": "soon"}, "expires: expected a duration"),
])
def test_issue_requests_refused_with_what_is_wrong(body, message):
    with pytest.raises(MemberError, match=message) as e:
        parse_issue(body)
    assert e.value.status == 400


def test_revoke_requests():
    assert parse_revoke({"user": "alice", "token_id": "a12"}) == ("alice", "a12")
    for bad in (None, {"user": "alice"}, {"user": "", "token_id": "a1"},
                {"user": "alice", "token_id": 12}):
        with pytest.raises(MemberError, match="Send JSON"):
            parse_revoke(bad)


def test_the_page_lists_members_with_their_tokens_and_never_a_token_itself():
    users = [
        {"name": "bob", "admin": False, "servers": {}, "last_activity": None},
        {"name": "admin", "admin": True, "servers": {"train": {}, "": {"ready": True}},
         "last_activity": "2026-11-30T17:09:36.123456Z"},
    ]
    tokens = {"admin": [{"id": "a1", "created": "2026-11-01T10:00:00Z",
                         "expires_at": None, "last_activity": "2026-11-30T17:00:00Z",
                         "expired": False, "token": "must-not-show"}],
              "bob": [{"id": "a2", "created": "2026-10-01T10:00:00Z",
                       "expires_at": "2026-11-01T10:00:00Z", "last_activity": None,
                       "expired": True}]}
    model = members_model(users, tokens)
    assert [m["name"] for m in model["members"]] == ["admin", "bob"]
    admin, bob = model["members"]
    assert admin["admin"] and admin["server"] == "default, train"
    assert bob["server"] == ""
    assert admin["last_activity"] == "2026-11-30 17:09"
    assert admin["tokens"] == [{"id": "a1", "created": "2026-11-01 10:00", "expires": "never",
                                "last_used": "2026-11-30 17:00", "expired": False}]
    assert bob["tokens"][0]["expired"] and bob["tokens"][0]["last_used"] == "never"
    assert model["summary"] == "2 members, 1 with a valid login token"
    assert "must-not-show" not in repr(model)
