"""Load: N lab members arriving over a window, each logging in, spawning, computing, stopping.

Each simulated user (created beforehand with a login token, not timed):

* login: GET /hub/login (the ``_xsrf`` cookie and form field), POST /hub/login with
  username + password=token as the browser's form does, keeping the session cookie; the
  session is then checked with GET /hub/api/user;
* spawn: POST /hub/api/users/NAME/server with their token, then polls their own user
  model until the hub reports the server ready (what the progress page waits for);
* execute: a new kernel runs the autograd walkthrough (tests/integration/autograd_cell.py)
  over the websocket; wrong gradients count as a failure;
* stop: DELETE the server, poll until the hub no longer lists it.

Arrivals are spread evenly over ``--window`` seconds; at most ``--max-concurrent`` users
are in flight (a user whose arrival finds every slot busy waits: "queued" in the output).
The hub container's CPU and memory are sampled with ``docker stats`` every 2 s. After the
run it checks that none of the bench users' containers (which are gpulab's lease table)
are left, then deletes the users and their home volumes, also when the run failed.

``--baseline`` runs the same load (without login: the stock hub uses the null
authenticator, so users spawn with REST tokens only) against a stock DockerSpawner hub
(bench/spawn.py's ``gpulab-bench-vanilla``, port 8001) after gpulab's run, and prints
both side by side. From the repository root, stack up::

    python -m bench.load --users 20 --window 60 [--max-concurrent 10] [--baseline]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import requests

from bench.spawn import VANILLA, start_vanilla_hub, stop_vanilla_hub
from tests.integration.autograd_cell import AUTOGRAD_CELL, chain_grads, close
from tests.integration.stack import Hub, LabUser, StackError, docker

PHASES = ("login", "spawn", "execute", "stop")
PHASE_LABELS = {"login": "login", "spawn": "spawn-to-ready", "execute": "first execute",
                "stop": "stop"}
POLL = 0.25  # seconds between a user's polls of their own model (browser-like, not 0.05)
GPULAB_HUB = "gpulab-hub"


class PhaseError(Exception):
    pass


# ---------------------------------------------------------------- one user's phases


def login(hub_url: str, name: str, token: str, timeout: float) -> requests.Session:
    """Sign in through the login form; return the session holding the login cookie."""
    s = requests.Session()
    # A browser navigation: JupyterHub 6 sets the _xsrf cookie only for those.
    r = s.get(f"{hub_url}/hub/login", headers={"Sec-Fetch-Mode": "navigate"}, timeout=timeout)
    if r.status_code != 200:
        raise PhaseError(f"GET /hub/login: HTTP {r.status_code}")
    m = re.search(r'name="_xsrf"\s+value="([^"]+)"', r.text)
    xsrf = m.group(1) if m else s.cookies.get("_xsrf")
    if not xsrf or "_xsrf" not in s.cookies:
        raise PhaseError("the login page set no _xsrf cookie or form field")
    r = s.post(f"{hub_url}/hub/login",
               data={"_xsrf": xsrf, "username": name, "password": token},
               headers={"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Site": "same-origin",
                        "Referer": f"{hub_url}/hub/login"},
               allow_redirects=False, timeout=timeout)
    if r.status_code != 302:
        err = re.search(r'login_error[^>]*>\s*([^<]+)', r.text)
        raise PhaseError(f"POST /hub/login: HTTP {r.status_code}"
                         + (f" ({err.group(1).strip()})" if err else ""))
    if not any(c.name.startswith("jupyterhub-hub-login") for c in s.cookies):
        raise PhaseError("POST /hub/login redirected but set no jupyterhub-hub-login cookie")
    # The cookie is a working session: the hub knows who we are from it alone.
    r = s.get(f"{hub_url}/hub/api/user", timeout=timeout)
    if r.status_code != 200 or r.json().get("name") != name:
        raise PhaseError(f"session cookie not accepted: GET /hub/api/user HTTP {r.status_code}")
    return s


def _own_server(user: LabUser, timeout: float) -> dict | None:
    r = requests.get(f"{user.hub.api}/users/{user.name}", headers=user._headers(),
                     timeout=timeout)
    if r.status_code != 200:
        raise PhaseError(f"GET own user model: HTTP {r.status_code} {r.text[:200]}")
    return r.json().get("servers", {}).get("")


def spawn(user: LabUser, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    r = requests.post(f"{user.hub.api}/users/{user.name}/server", json={},
                      headers=user._headers(), timeout=timeout)
    if r.status_code not in (201, 202):
        raise PhaseError(f"POST server: HTTP {r.status_code} {r.text[:300]}")
    while True:
        server = _own_server(user, 60)
        if server is None:
            raise PhaseError("the server vanished while pending (spawn failed; see hub log)")
        if server.get("ready"):
            return
        if time.monotonic() > deadline:
            raise PhaseError(f"not ready after {timeout:.0f} s (pending={server.get('pending')})")
        time.sleep(POLL)


def check_autograd(stdout: str) -> str:
    """The walkthrough's result checked as tests/integration/test_autograd.py does;
    returns the device it ran on, raises PhaseError on any wrong value."""
    try:
        res = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise PhaseError(f"kernel output is not the result JSON: {stdout[-200:]!r}") from None
    wrong = []
    lin = res["linear"]
    if lin["loss"] != 4.0:
        wrong.append(f"loss={lin['loss']}")
    if (lin["w"], lin["x"], lin["b"]) != (12.0, 8.0, 4.0):
        wrong.append(f"(w,x,b).grad={(lin['w'], lin['x'], lin['b'])}")
    if not lin["grad_device"].startswith(res["device"]):
        wrong.append(f"grad on {lin['grad_device']}, tensors on {res['device']}")
    if res["minimum"] != 0.0:
        wrong.append(f"minimum grad={res['minimum']}")
    if res["cubic"] != {"first": [12.0, 3.0], "second": [12.0, -6.0]}:
        wrong.append(f"cubic={res['cubic']}")
    chain = res["chain"]
    if [chain[n]["shape"] for n in ("X", "W", "B")] != [[4, 3], [3, 2], [2]]:
        wrong.append("chain grad shapes")
    else:
        ref = chain_grads(chain["X"]["value"], chain["W"]["value"], chain["B"]["value"])
        for n, expected in zip(("X", "W", "B"), ref, strict=True):
            if not close(chain[n]["grad"], expected):
                wrong.append(f"chain {n}.grad")
    if wrong:
        raise PhaseError("wrong autograd result: " + ", ".join(wrong))
    return res["device"]


def stop(user: LabUser, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    r = requests.delete(f"{user.hub.api}/users/{user.name}/server", headers=user._headers(),
                        timeout=timeout)
    if r.status_code not in (202, 204):
        raise PhaseError(f"DELETE server: HTTP {r.status_code} {r.text[:300]}")
    while _own_server(user, 60) is not None:
        if time.monotonic() > deadline:
            raise PhaseError(f"still listed {timeout:.0f} s after DELETE")
        time.sleep(POLL)


# ---------------------------------------------------------------- the run


@dataclass
class UserResult:
    name: str
    times: dict[str, float] = field(default_factory=dict)
    failed: tuple[str, str] | None = None  # (phase, error)
    queued: float = 0.0
    device: str | None = None


@dataclass
class RunResult:
    hub: str
    users: list[UserResult]
    wall: float
    stats: dict[str, float]
    leaks: list[str]
    with_login: bool


def run_user(user: LabUser, arrival: float, with_login: bool, timeout: float) -> UserResult:
    res = UserResult(user.name)
    now = time.monotonic()
    if now < arrival:
        time.sleep(arrival - now)
    res.queued = max(0.0, time.monotonic() - arrival)

    def phase(name, fn):
        t0 = time.monotonic()
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - every error is a measured failure
            res.failed = res.failed or (name, f"{type(e).__name__}: {e}")
            return False, None
        res.times[name] = time.monotonic() - t0
        return True, out

    if with_login:
        ok, _ = phase("login", lambda: login(user.hub.url, user.name, user.token, timeout))
        if not ok:
            return res
    ok, _ = phase("spawn", lambda: spawn(user, timeout))
    if ok:
        _, res.device = phase(
            "execute", lambda: check_autograd(user.run_code(AUTOGRAD_CELL, timeout=timeout)))
    # Stop even after a failed spawn or execute: a half-started server is stopped too.
    phase("stop", lambda: stop(user, timeout))
    return res


class StatsSampler(threading.Thread):
    """`docker stats` of one container every *interval* s: CPU % and memory MiB."""

    def __init__(self, container: str, interval: float = 2.0):
        super().__init__(daemon=True)
        self.container, self.interval = container, interval
        self.cpu: list[float] = []
        self.mem: list[float] = []
        self.errors = 0
        self._done = threading.Event()

    def run(self):
        while not self._done.is_set():
            t0 = time.monotonic()
            try:
                out = subprocess.run(
                    ["docker", "stats", "--no-stream", "--format", "{{json .}}", self.container],
                    capture_output=True, text=True, timeout=30)
                row = json.loads(out.stdout.strip().splitlines()[0])
                self.cpu.append(float(row["CPUPerc"].rstrip("%")))
                self.mem.append(_mib(row["MemUsage"].split("/")[0]))
            except (subprocess.SubprocessError, ValueError, IndexError, KeyError):
                self.errors += 1
            self._done.wait(max(0.0, self.interval - (time.monotonic() - t0)))

    def finish(self) -> dict[str, float]:
        self._done.set()
        self.join(60)
        if not self.cpu:
            return {"samples": 0, "errors": self.errors}
        return {"samples": len(self.cpu), "errors": self.errors,
                "cpu_peak": max(self.cpu), "cpu_mean": statistics.fmean(self.cpu),
                "mem_peak": max(self.mem), "mem_mean": statistics.fmean(self.mem)}


def _mib(text: str) -> float:
    m = re.fullmatch(r"\s*([\d.]+)\s*([kKMGT]?i?B)\s*", text)
    if not m:
        raise ValueError(text)
    scale = {"B": 1 / 2**20, "KiB": 1 / 1024, "kB": 1e3 / 2**20, "MiB": 1, "MB": 1e6 / 2**20,
             "GiB": 1024, "GB": 1e9 / 2**20, "TiB": 2**20, "TB": 1e12 / 2**20}
    return float(m.group(1)) * scale.get(m.group(2), 1)


def user_containers(kind: str, names: list[str]) -> list[str]:
    """Containers of the bench's users still on the host: for gpulab, the containers
    whose labels are the lease table; for the stock hub, DockerSpawner's names."""
    if kind == "gpulab":
        fmt = '{{.ID}} {{.Names}} {{.Label "org.gpulab.user"}} {{.Label "org.gpulab.gpus"}}'
        rows = docker("ps", "-a", "--filter", "label=org.gpulab.managed=true", "--format", fmt)
        wanted = set(names)
        return [r for r in rows.splitlines() if r.split()[2:3] and r.split()[2] in wanted]
    rows = docker("ps", "-a", "--filter", "name=bench-vanilla-", "--format", "{{.ID}} {{.Names}}")
    wanted = {f"bench-vanilla-{n}" for n in names}
    return [r for r in rows.splitlines() if r.split()[1] in wanted]


def run_load(kind: str, hub: Hub, container: str, args) -> RunResult:
    with_login = kind == "gpulab"
    users: list[LabUser] = []
    try:
        for _ in range(args.users):
            users.append(hub.create_user(prefix="load"))
        print(f"[{kind}] {len(users)} users created; arrivals over {args.window:.0f} s, "
              f"at most {args.max_concurrent} in flight", flush=True)
        sampler = StatsSampler(container)
        sampler.start()
        t0 = time.monotonic()
        step = args.window / args.users
        try:
            with ThreadPoolExecutor(args.max_concurrent) as pool:
                futures = [pool.submit(run_user, u, t0 + i * step, with_login, args.timeout)
                           for i, u in enumerate(users)]
                results = []
                for f in futures:
                    r = f.result()
                    results.append(r)
                    state = f"FAILED in {r.failed[0]}" if r.failed else "ok"
                    print(f"[{kind}] {r.name}: {state} "
                          + " ".join(f"{p}={r.times[p]:.2f}" for p in PHASES if p in r.times),
                          flush=True)
        finally:
            wall = time.monotonic() - t0
            stats = sampler.finish()
        # Leaks: after every user stopped, none of their containers (leases) may remain.
        names = [u.name for u in users]
        deadline = time.monotonic() + 15
        while (leaks := user_containers(kind, names)) and time.monotonic() < deadline:
            time.sleep(1)
        return RunResult(kind, results, wall, stats, leaks, with_login)
    finally:
        cleanup(kind, hub, users)


def cleanup(kind: str, hub: Hub, users: list[LabUser]) -> None:
    names = [u.name for u in users]
    for name in names:
        try:
            hub.delete_user(name)
        except Exception as e:  # noqa: BLE001 - keep cleaning up the others
            print(f"[{kind}] cleanup: deleting {name} failed: {e}", flush=True)
    for row in user_containers(kind, names):
        print(f"[{kind}] cleanup: removing leftover container {row}", flush=True)
        docker("rm", "-f", row.split()[0], check=False)
    if kind == "gpulab":
        for name in names:
            docker("volume", "rm", "-f", f"gpulab-home-{name}", check=False)
        left = [v for v in docker("volume", "ls", "-q").split()
                if v in {f"gpulab-home-{n}" for n in names}]
        if left:
            print(f"[{kind}] cleanup: volumes left: {left}", flush=True)


# ---------------------------------------------------------------- report


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[max(0, math.ceil(q * len(xs)) - 1)]


def cell(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.2f} / {pct(xs, 0.95):6.2f}" if xs else f"{'-':>15}"


def times(run: RunResult, p: str) -> list[float]:
    return [u.times[p] for u in run.users if p in u.times]


def report(runs: list[RunResult], args) -> None:
    for run in runs:
        n = len(run.users)
        ok = sum(1 for u in run.users if not u.failed)
        devices = Counter(u.device for u in run.users if u.device)
        queued = [u.queued for u in run.users]
        print(f"\n== {run.hub}: {n} users over {args.window:.0f} s, max {args.max_concurrent} "
              f"in flight: {ok}/{n} completed every phase, wall {run.wall:.1f} s")
        if not run.with_login:
            print("   login skipped: the stock hub uses the null authenticator; users spawn "
                  "with REST tokens")
        print(f"   queued behind --max-concurrent: max {max(queued):.1f} s; kernels ran on "
              + (", ".join(f"{d} x{c}" for d, c in devices.items()) or "-"))
        fails = [u.failed for u in run.users if u.failed]
        by_phase = Counter(p for p, _ in fails)
        print("   failures by phase: " + (", ".join(
            f"{p} {by_phase[p]}" for p in PHASES if by_phase[p]) or "none"))
        kinds: dict[tuple[str, str], list[str]] = {}
        for p, err in fails:
            key = (p, re.sub(r"load-[0-9a-f]{8}|\d+(\.\d+)?", "#", err)[:120])
            kinds.setdefault(key, []).append(err)
        for (p, _), errs in kinds.items():
            print(f"     {p} x{len(errs)}, first: {errs[0][:400]}")
        s = run.stats
        if s.get("samples"):
            print(f"   hub container: CPU peak {s['cpu_peak']:.1f} % mean {s['cpu_mean']:.1f} %,"
                  f" memory peak {s['mem_peak']:.0f} MiB mean {s['mem_mean']:.0f} MiB "
                  f"({s['samples']} samples every 2 s)")
        else:
            print(f"   hub container: no docker stats samples ({s.get('errors')} errors)")
        print("   leftover user containers / leases: "
              + ("none" if not run.leaks else f"{len(run.leaks)}: {run.leaks}"))

    g = runs[0]
    v = runs[1] if len(runs) > 1 else None
    print("\nseconds, median / p95 (nearest rank), successful phases only")
    head = f"{'phase':16} {'gpulab':>15} {'n':>3}"
    if v:
        head += f"   {'vanilla':>15} {'n':>3}   {'gpulab/vanilla':>14}"
    print(head)
    for p in PHASES:
        gx = times(g, p)
        line = f"{PHASE_LABELS[p]:16} {cell(gx)} {len(gx):3}"
        if v:
            vx = times(v, p)
            if p == "login" and not v.with_login:
                line += f"   {'(no login)':>15} {'-':>3}   {'-':>14}"
            else:
                ratio = (f"{statistics.median(gx) / statistics.median(vx):.2f}x"
                         f" / {pct(gx, .95) / pct(vx, .95):.2f}x") if gx and vx else "-"
                line += f"   {cell(vx)} {len(vx):3}   {ratio:>14}"
        print(line)
    if v:
        gs, vs = g.stats, v.stats
        if gs.get("samples") and vs.get("samples"):
            print(f"{'hub CPU %':16} {gs['cpu_peak']:6.1f} pk {gs['cpu_mean']:5.1f} mn   "
                  f"   {vs['cpu_peak']:6.1f} pk {vs['cpu_mean']:5.1f} mn")
            print(f"{'hub mem MiB':16} {gs['mem_peak']:6.0f} pk {gs['mem_mean']:5.0f} mn   "
                  f"   {vs['mem_peak']:6.0f} pk {vs['mem_mean']:5.0f} mn")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=20, help="simulated users (default 20)")
    ap.add_argument("--window", type=float, default=60,
                    help="arrivals spread evenly over this many seconds (default 60)")
    ap.add_argument("--max-concurrent", type=int, default=10,
                    help="users in flight at once at most (default 10)")
    ap.add_argument("--timeout", type=float, default=300,
                    help="per-phase timeout in seconds (default 300)")
    ap.add_argument("--baseline", action="store_true",
                    help="also run the load against a stock DockerSpawner hub")
    args = ap.parse_args()
    if args.users < 1 or args.max_concurrent < 1 or args.window < 0:
        ap.error("--users and --max-concurrent must be >= 1, --window >= 0")

    gpulab = Hub()
    if not gpulab.is_up():
        raise SystemExit("the gpulab hub is not up: run `make up` first")
    runs = [run_load("gpulab", gpulab, GPULAB_HUB, args)]
    if args.baseline:
        try:
            vanilla = start_vanilla_hub()
            runs.append(run_load("vanilla", vanilla, VANILLA, args))
        finally:
            stop_vanilla_hub()
    report(runs, args)
    bad = any(u.failed for r in runs for u in r.users) or any(r.leaks for r in runs)
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except (requests.RequestException, subprocess.SubprocessError, StackError) as e:
        raise SystemExit(f"bench failed: {e}") from None
