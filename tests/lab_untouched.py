"""`make test` leaves a lab in use as it found it: the proof, from outside (.ci/run).

Before `make test`, on a lab brought up with `make up GPULAB_DEMO=1` whose admin started
her server with a (simulated) GPU, ``save`` notes what the lab is: every container of
its stack and every member's server on this engine (ID, start time, lease labels), the
files of its config/ (their hashes), its firewall rules, and the admin's server as the
hub reports it. After `make test`, ``check`` finds the same, or says what changed.

    python -m tests.lab_untouched start-admin-server   the admin's server, with 1 GPU
    python -m tests.lab_untouched save FILE
    python -m tests.lab_untouched check FILE
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from gpulab.settings import load_settings
from tests.integration.stack import REPO, Hub, docker, wait_for


def _admin() -> str:
    return load_settings(REPO / "config" / "gpulab.yaml")["hub.admins"][0]


def start_admin_server() -> None:
    hub = Hub()
    admin = _admin()
    r = hub.request("POST", f"/users/{admin}/server", json={"gpus": 1})
    if r.status_code == 400 and "already running" in r.text:
        pass  # a lab in use already (a second run here): its GPU is checked below
    elif r.status_code not in (201, 202):
        raise SystemExit(f"[lab-untouched] the admin's server did not start: {r.text}")
    wait_for(lambda: (hub.server_model(admin) or {}).get("ready"), 120,
             what=f"{admin}'s server to be ready")
    labels = json.loads(docker("inspect", f"gpulab-user-{admin}"))[0]["Config"]["Labels"]
    if not labels["org.gpulab.gpus"]:
        raise SystemExit(f"[lab-untouched] {admin}'s server holds no GPU")
    print(f"[lab-untouched] {admin}'s server runs with GPU(s) {labels['org.gpulab.gpus']}")


def state() -> dict:
    containers = {}
    for cid in docker("ps", "-aq").split():
        info = json.loads(docker("inspect", cid))[0]
        labels = info["Config"]["Labels"] or {}
        if info["Name"].startswith("/gpulab-") or labels.get("org.gpulab.managed") == "true":
            containers[info["Name"].lstrip("/")] = {
                "id": info["Id"], "started": info["State"]["StartedAt"],
                "running": info["State"]["Running"],
                "lease": {k: v for k, v in labels.items() if k.startswith("org.gpulab.")}}
    config = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
              for p in sorted((REPO / "config").iterdir()) if p.is_file()}
    rules = sorted(line for line in subprocess.run(["iptables", "-S"], capture_output=True,
                                                   text=True).stdout.splitlines()
                   if "gpulab-netguard" in line)
    admin = _admin()
    server = Hub().server_model(admin) or {}
    return {"containers": containers, "config": config, "firewall": rules,
            "admin_server": {k: server.get(k) for k in ("ready", "started", "user_options")}}


def differences(before: dict, after: dict) -> list[str]:
    out = []
    for part in ("containers", "config", "firewall", "admin_server"):
        if part == "firewall":
            gone = sorted(set(before[part]) - set(after[part]))
            new = sorted(set(after[part]) - set(before[part]))
            out += [f"firewall rule gone: {r}" for r in gone]
            out += [f"firewall rule added: {r}" for r in new]
            continue
        b, a = before[part], after[part]
        for key in sorted(set(b) | set(a)):
            if b.get(key) != a.get(key):
                out.append(f"{part} {key}: {b.get(key)} -> {a.get(key)}")
    return out


def main(argv: list[str]) -> int:
    if argv == ["start-admin-server"]:
        start_admin_server()
        return 0
    if len(argv) == 2 and argv[0] == "save":
        Path(argv[1]).write_text(json.dumps(state(), indent=1))
        s = json.loads(Path(argv[1]).read_text())
        print(f"[lab-untouched] noted {len(s['containers'])} containers, "
              f"{len(s['config'])} config files, {len(s['firewall'])} firewall rules")
        return 0
    if len(argv) == 2 and argv[0] == "check":
        changed = differences(json.loads(Path(argv[1]).read_text()), state())
        for line in changed:
            print(f"[lab-untouched] CHANGED: {line}", file=sys.stderr)
        if not changed:
            print("[lab-untouched] the lab is as it was before make test: its containers, "
                  "the admin's server and its GPU, config/ and firewall rules")
        return 1 if changed else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
