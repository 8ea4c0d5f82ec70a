"""The SSH gateway's host key is made once and then kept (gpulab.ssh.hostkey)."""

from __future__ import annotations

import stat

import asyncssh

from gpulab.ssh import hostkey


def test_made_once_then_kept_with_private_permissions(tmp_path):
    done, first = hostkey.ensure(tmp_path)
    assert done == "made" and first.startswith("SHA256:")
    key = tmp_path / hostkey.KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.with_name(key.name + ".pub").stat().st_mode) == 0o644
    done, again = hostkey.ensure(tmp_path)
    assert (done, again) == ("kept", first)
    assert asyncssh.read_private_key(str(key)).get_fingerprint("sha256") == first
    assert not list(tmp_path.glob("*.new"))


def test_known_hosts_line_names_the_port():
    assert hostkey.known_hosts_line("ssh-ed25519 AAAA gpulab-ssh", "lab", 2222) == \
        "[lab]:2222 ssh-ed25519 AAAA\n"
    assert hostkey.known_hosts_line("ssh-ed25519 AAAA", "lab", 22) == "lab ssh-ed25519 AAAA\n"
