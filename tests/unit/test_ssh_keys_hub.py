"""Members' SSH keys (gpulab.login.sshkeys): parsing, and the REST API against a real
``jupyterhub`` (tests/unit/real_hub.py) with the gpulab-ssh service as the gateway."""

from __future__ import annotations

import asyncssh
import pytest
from real_hub import new_hub
from test_login_hub import member, new_name, self_made_token

from gpulab.login.sshkeys import KEY_TOKEN_NOTE, BadKey, key_token_scopes, parse_public_key
from gpulab.ssh import policy


def public(algorithm: str = "ssh-ed25519", comment: str = "alice@laptop", **kw) -> str:
    key = asyncssh.generate_private_key(algorithm, comment=comment, **kw)
    return key.export_public_key().decode().strip()


def test_a_public_key_line_is_parsed_and_compared_without_its_comment():
    line = public()
    key = parse_public_key(f"  {line}  \n")
    assert key.algorithm == "ssh-ed25519" and key.comment == "alice@laptop"
    assert key.line == " ".join(line.split()[:2])
    assert key.fingerprint.startswith("SHA256:")
    assert parse_public_key(key.line).fingerprint == key.fingerprint  # no comment
    assert parse_public_key(public("ecdsa-sha2-nistp256")).algorithm == "ecdsa-sha2-nistp256"
    assert parse_public_key(public("ssh-rsa", key_size=2048)).algorithm == "ssh-rsa"


@pytest.mark.parametrize("text, why", [
    ("", "No key given"),
    (asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode(),
     "That is a private key"),
    ("ssh-ed25519 not-base64", "Not an OpenSSH public key"),
    ("hello", "Not an OpenSSH public key"),
    (public("ssh-rsa", key_size=1024), "This RSA key has 1024 bits"),
    (public() + "\n" + public(), "One public key, on one line"),
])
def test_what_is_not_an_acceptable_public_key_says_why(text, why):
    with pytest.raises(BadKey, match=why):
        parse_public_key(text)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    running = new_hub(tmp_path_factory.mktemp("hub"))
    running.start()
    yield running
    running.stop()


def test_a_member_adds_lists_and_removes_her_keys_with_her_login_token_only(hub):
    name, token = member(hub, "keys")
    other, other_token = member(hub, "keys")
    line = public()
    r = hub.api("POST", f"/gpulab/ssh-keys/{name}", {"key": line}, token=token)
    assert r.status == 201, r.text
    model = r.json()
    assert (model["user"], model["fingerprint"], model["comment"], model["added_by"]) == (
        name, parse_public_key(line).fingerprint, "alice@laptop", f"user {name}")
    again = hub.api("POST", f"/gpulab/ssh-keys/{name}", {"key": line}, token=token)
    assert again.status == 409 and "has this key already" in again.json()["message"]
    private = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    r = hub.api("POST", f"/gpulab/ssh-keys/{name}", {"key": private}, token=token)
    assert r.status == 400 and "never paste it anywhere" in r.json()["message"], r.text
    r = hub.api("POST", f"/gpulab/ssh-keys/{name}", {"key": line, "user": "x"}, token=token)
    assert r.status == 400, r.text

    # not with a token she made herself (what code in her server could hold), not with
    # another member's login token, not for someone else
    mine = self_made_token(token, name, hub=hub).json()["token"]
    for who, t, target in ((name, mine, name), (other, other_token, name),
                           (name, token, other)):
        r = hub.api("POST", f"/gpulab/ssh-keys/{target}", {"key": public()}, token=t)
        assert r.status == 403, (who, target, r.text)
        assert hub.api("GET", f"/gpulab/ssh-keys/{target}", token=t).status == 403

    listed = hub.api("GET", f"/gpulab/ssh-keys/{name}", token=token).json()["ssh_keys"]
    assert [k["id"] for k in listed] == [model["id"]]
    # an admin (the gpulab-admin service) sees and manages them too
    assert hub.api("GET", f"/gpulab/ssh-keys/{name}").json()["ssh_keys"] == listed
    r = hub.api("POST", f"/gpulab/ssh-keys/{name}", {"key": public(comment="ci")})
    assert r.status == 201 and r.json()["added_by"] == "service gpulab-admin", r.text
    assert hub.api("DELETE", f"/gpulab/ssh-keys/{name}/{model['id']}", token=token).status == 200
    assert hub.api("DELETE", f"/gpulab/ssh-keys/{name}/{model['id']}", token=token).status == 404
    left = hub.api("GET", f"/gpulab/ssh-keys/{name}", token=token).json()["ssh_keys"]
    assert [k["comment"] for k in left] == ["ci"]


def sign_in(hub, name: str, line: str, check: bool = False, token: str | None = None):
    return hub.api("POST", "/gpulab/ssh-sign-in", {"user": name, "key": line, "check": check},
                   token=token or hub.ssh_token)


def test_the_gateway_gets_a_token_for_her_own_server_for_her_key_only(hub):
    name, token = member(hub, "keysign")
    line, stranger = public(), public()
    assert hub.api("POST", f"/gpulab/ssh-keys/{name}", {"key": line}, token=token).status == 201

    # only the gpulab-ssh service: not an admin, not the member
    for t in (hub.admin_token, token):
        r = sign_in(hub, name, line, token=t)
        assert r.status == 403 and "Only the gpulab-ssh service" in r.json()["message"]
    assert sign_in(hub, name, stranger, check=True).status == 403  # not her key
    assert sign_in(hub, new_name("nobody"), line, check=True).status == 403
    assert sign_in(hub, name, line, check=True).json() == {"user": name}

    r = sign_in(hub, name, line)
    assert r.status == 201, r.text
    given = r.json()
    model = hub.api("GET", "/user", token=given["token"]).json()
    assert model["name"] == name  # JupyterHub adds the owner's identity to every token
    assert set(model["scopes"]) == {*key_token_scopes(name), f"read:users:groups!user={name}"}
    assert policy.judge(name, 200, model).outcome == policy.OK  # the gateway's own check
    # it opens nothing else: not her tokens, not the hub's user list
    assert hub.api("GET", f"/users/{name}/tokens", token=given["token"]).status == 403
    assert hub.api("GET", "/users", token=given["token"]).status == 403
    listed = hub.api("GET", f"/gpulab/ssh-keys/{name}", token=token).json()["ssh_keys"]
    assert listed[0]["last_used"] is not None

    # the connection ends: its token goes; the gateway can delete no other token of hers
    login_id = hub.api("GET", f"/gpulab/login-tokens/{name}").json()["login_tokens"][0]["id"]
    r = hub.api("DELETE", "/gpulab/ssh-sign-in", {"user": name, "token_id": login_id},
                token=hub.ssh_token)
    assert r.status == 404, r.text
    r = hub.api("DELETE", "/gpulab/ssh-sign-in", {"user": name, "token_id": given["id"]},
                token=hub.ssh_token)
    assert r.status == 200, r.text
    assert hub.api("GET", "/user", token=given["token"]).status == 403
    notes = [t["note"] for t in hub.api("GET", f"/users/{name}/tokens").json()["api_tokens"]]
    assert not any(n.startswith(KEY_TOKEN_NOTE) for n in notes), notes


def test_keys_sign_in_only_while_she_has_access_and_end_with_it(hub):
    name, token = member(hub, "keyend")
    line = public()
    assert hub.api("POST", f"/gpulab/ssh-keys/{name}", {"key": line}, token=token).status == 201
    given = sign_in(hub, name, line).json()
    # her last login token revoked: the key's token stops working, the key signs in no more
    login_id = hub.api("GET", f"/gpulab/login-tokens/{name}").json()["login_tokens"][0]["id"]
    assert hub.api("DELETE", f"/gpulab/login-tokens/{name}/{login_id}").status == 200
    assert hub.api("GET", "/user", token=given["token"]).status == 403
    r = sign_in(hub, name, line, check=True)
    assert r.status == 403 and "has no access" in r.json()["message"], r.text
    # a new login token: her key is still hers
    token = hub.api("POST", f"/gpulab/login-tokens/{name}", {"expires_in": 600}).json()["token"]
    assert sign_in(hub, name, line, check=True).status == 200
    # an admin ends her access: her keys go with it
    r = hub.api("DELETE", f"/gpulab/access/{name}", {"stop_servers": False})
    assert r.status == 200 and r.json()["removed_ssh_keys"] == 1, r.text
    hub.api("POST", f"/gpulab/login-tokens/{name}", {"expires_in": 600})
    assert sign_in(hub, name, line, check=True).status == 403
    assert hub.api("GET", f"/gpulab/ssh-keys/{name}").json()["ssh_keys"] == []


def test_a_deleted_users_keys_do_not_sign_in_a_new_user_of_the_same_name(hub):
    name, token = member(hub, "keydel")
    line = public()
    assert hub.api("POST", f"/gpulab/ssh-keys/{name}", {"key": line}, token=token).status == 201
    assert hub.api("DELETE", f"/users/{name}").status == 204
    assert hub.api("POST", f"/users/{name}", {}).status == 201  # someone else, same name
    assert hub.api("POST", f"/gpulab/login-tokens/{name}", {"expires_in": 600}).status == 201
    assert sign_in(hub, name, line, check=True).status == 403
    assert hub.api("GET", f"/gpulab/ssh-keys/{name}").json()["ssh_keys"] == []


def test_the_gateway_is_told_clearly_what_it_sent_wrong(hub):
    name, _ = member(hub, "keybad")
    r = hub.api("POST", "/gpulab/ssh-sign-in", {"user": name, "key": 42}, token=hub.ssh_token)
    assert r.status == 400 and '"key"' in r.json()["message"], r.text
    r = hub.api("DELETE", f"/gpulab/ssh-keys/{name}/%C2%B2")  # "²": a digit, no number
    assert r.status == 404, r.text
