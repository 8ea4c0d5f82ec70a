"""SSH with a key instead of a login token, with the real OpenSSH client and ssh-keygen.

A member registers her public key through the REST API with her login token (through
the published port), then signs in with the private key alone (BatchMode: nothing is
typed, no password is ever offered). What is tried:

* her key opens her own server, and only as her: under another member's name, or a key
  nobody registered, is refused;
* someone else's wrong passwords lock her username for passwords, not for her key;
* an admin ends her access: her open key session closes within seconds, saying why,
  and her key signs in no more (it is removed with her access);
* the gateway's log holds no token, and her server never holds a token of hers other
  than the connection's own, scoped to it.

(The VS Code flow with a key is test_ssh.py's, parametrized.)
"""

from __future__ import annotations

import subprocess
import time

import requests

from .stack import HUB_URL, container_logs, wait_for
from .test_ssh import FAILED_NAMES, SSH_CONTAINER, refused, registered_key, ssh, throttle_hygiene  # noqa: F401  (fixtures)

DEADLINE = 30.0  # seconds: "within seconds", with room for a loaded CI host


def test_her_key_opens_her_server_and_nothing_else(ssh, lab_user, tmp_path):  # noqa: F811
    alice, bob = lab_user("keyalice"), lab_user("keybob")
    alice.start_server()
    key = registered_key(alice, tmp_path)
    r = ssh.run_with_key(alice.name, key, command="whoami; hostname; env")
    assert r.returncode == 0, r
    lines = r.stdout.splitlines()
    assert lines[0] == "jovyan" and lines[1] == subprocess.run(
        ["docker", "inspect", "-f", "{{.Config.Hostname}}", alice.container],
        capture_output=True, text=True).stdout.strip(), r
    # her key under bob's name; a key nobody registered
    r = ssh.run_with_key(bob.name, key, command="true")
    assert r.returncode == 255 and "Permission denied (publickey" in r.stderr, r
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)],
                   check=True)
    r = ssh.run_with_key(alice.name, stranger, command="true")
    assert r.returncode == 255 and "Permission denied (publickey" in r.stderr, r
    # no token in the gateway's log; the one her server saw for the connection is gone
    log = container_logs(SSH_CONTAINER, 300)
    assert alice.token not in log and f"ssh sign-in: {alice.name} from" in log

    def connection_tokens() -> list[str]:
        listed = requests.get(f"{HUB_URL}/hub/api/users/{alice.name}/tokens", timeout=30,
                              headers={"Authorization": f"token {alice.token}"})
        assert listed.status_code == 200, listed.text
        return [t["note"] for t in listed.json()["api_tokens"]
                if (t["note"] or "").startswith("gpulab-ssh: key sign-in")]
    wait_for(lambda: not connection_tokens(), 15, interval=0.5,
             what="the ended connection's token to be deleted")


def test_code_in_her_server_cannot_register_a_key(ssh, lab_user, tmp_path):  # noqa: F811
    """What a package she installed would try: her server's own token (and the OAuth
    token of her JupyterLab session) adding a key, to get in later without her."""
    erin = lab_user("keyplant")
    erin.start_server()
    pub = tmp_path / "planted"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(pub)], check=True)
    line = pub.with_suffix(".pub").read_text().strip()
    script = (
        "import json, os, urllib.request as u\n"
        "req = u.Request(os.environ['JUPYTERHUB_API_URL'] + '/gpulab/ssh-keys/' +"
        " os.environ['JUPYTERHUB_USER'], data=json.dumps({'key': os.environ['KEY']}).encode(),"
        " headers={'Authorization': 'token ' + os.environ['JUPYTERHUB_API_TOKEN'],"
        " 'Content-Type': 'application/json'}, method='POST')\n"
        "try:\n    print(u.urlopen(req, timeout=20).status)\n"
        "except u.HTTPError as e:\n    print(e.code, json.load(e)['message'])\n")
    r = subprocess.run(["docker", "exec", "-e", f"KEY={line}", erin.container, "python3",
                        "-c", script], capture_output=True, text=True, timeout=60)
    assert r.stdout.startswith("403 Only the member (with her login token, or signed in "), r
    r = ssh.run_with_key(erin.name, pub, command="true")
    assert r.returncode == 255 and "Permission denied (publickey" in r.stderr, r


def test_others_wrong_passwords_lock_her_username_but_not_her_key(ssh, lab_user,  # noqa: F811
                                                                  tmp_path):
    carol = lab_user("keylock")
    carol.start_server()
    key = registered_key(carol, tmp_path)
    FAILED_NAMES.append(carol.name)
    for i in range(5):  # someone else guessing: 5 failures lock the username
        assert refused(ssh.run(carol.name, f"guess-{i}", command="true"))
    r = ssh.run(carol.name, carol.token, command="true")
    assert refused(r) and "Too many failed sign-ins" in r.stderr, r
    r = ssh.run_with_key(carol.name, key, command="echo in")
    assert (r.returncode, r.stdout) == (0, "in\n"), r


def test_ending_her_access_closes_her_key_session_and_removes_her_key(
        ssh, lab_user, hub, tmp_path):  # noqa: F811
    dana = lab_user("keyend")
    dana.start_server()
    key = registered_key(dana, tmp_path)
    session = subprocess.Popen(
        ssh.key_args(dana.name, key) + ["while true; do echo tick; sleep 0.5; done"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert session.stdout.readline() == "tick\n"
        r = hub.request("DELETE", f"/gpulab/access/{dana.name}", json={"stop_servers": False})
        assert r.status_code == 200 and r.json()["removed_ssh_keys"] == 1, r.text
        ended = time.monotonic()
        session.wait(timeout=DEADLINE)
        took = time.monotonic() - ended
        assert session.returncode == 255, session.returncode
        assert "Your access has ended" in session.stderr.read()
        print(f"key SSH session closed {took:.1f} s after her access ended")
    finally:
        if session.poll() is None:
            session.kill()
    r = ssh.run_with_key(dana.name, key, command="true")
    assert r.returncode == 255 and "Permission denied (publickey" in r.stderr, r
