"""TCP probes of the users' network, run where an attacker or a control runs them: inside a
member's server (her own code, through the hub, as she runs it), or by a command in a
container or a network namespace. "unreachable" (a timeout) is what a firewall's drop
looks like; "refused" means the packet arrived and nothing listens."""

from __future__ import annotations

import json
import subprocess

TCP = r'''
import socket
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "open"
    except socket.gaierror:
        return "no such host"
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        return "unreachable" if "timed out" in str(e) or "unreachable" in str(e) else repr(e)
'''


def _program(targets: dict[str, tuple[str, int]]) -> str:
    """Every target at once (a drop costs its 3 s timeout, once for the lot)."""
    return TCP + (
        "import json\nfrom concurrent.futures import ThreadPoolExecutor\n"
        f"targets = {targets!r}\n"
        "with ThreadPoolExecutor(max(1, len(targets))) as pool:\n"
        "    seen = dict(zip(targets, pool.map(lambda v: tcp(*v), targets.values())))\n"
        "print(json.dumps(seen))\n")


def probe(user, targets: dict[str, tuple[str, int]]) -> dict[str, str]:
    """Each target, as seen from inside *user*'s server."""
    return json.loads(user.run_code(_program(targets)).strip().splitlines()[-1])


def probe_with(command: list[str], targets: dict[str, tuple[str, int]]) -> dict[str, str]:
    """Each target, as seen by ``python3`` run through *command* (``docker exec ...``,
    ``nsenter --net=...``)."""
    out = subprocess.run([*command, "python3", "-c", _program(targets)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])
