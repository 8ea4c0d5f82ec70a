"""One spawn, phase by phase: where the seconds between "start my server" and "ready" go.

Pure: it reads the timestamps Docker already keeps (the container's Created and
StartedAt, and `docker logs --timestamps` of the user's container, the hub and the
proxy) and returns, for each phase, the seconds since the request. bench/spawn.py
gathers the inputs; tests/unit/test_bench_timeline.py checks the reading.
"""

from __future__ import annotations

from datetime import datetime

# In the order they happen; each is "seconds since the spawn request" at its end.
PHASES = (
    "container created",      # docker inspect .Created
    "container started",      # .State.StartedAt
    "server imports done",    # the server's first log line (it logs once its modules load)
    "server listening",       # "Jupyter Server ... is running at:"
    "hub sees it ready",      # the hub: "User NAME took N seconds to start"
    "route added",            # configurable-http-proxy: "Route added /user/NAME"
    "API says ready",         # GET /hub/api/users/NAME: the server's "ready" is true
)


def docker_time(stamp: str) -> float:
    """Epoch seconds of a Docker RFC 3339 timestamp (nanoseconds, 'Z')."""
    stamp = stamp.strip()
    if stamp.endswith("Z"):
        stamp = stamp[:-1] + "+00:00"
    head, _, rest = stamp.partition(".")
    if rest:  # Python parses at most 6 fractional digits
        digits = rest[:rest.index("+")] if "+" in rest else rest
        stamp = f"{head}.{(digits + '000000')[:6]}{rest[len(digits):]}"
    return datetime.fromisoformat(stamp).timestamp()


def log_lines(log: str) -> list[tuple[float, str]]:
    """`docker logs --timestamps` output as (epoch seconds, text)."""
    lines = []
    for line in log.splitlines():
        stamp, _, text = line.partition(" ")
        try:
            lines.append((docker_time(stamp), text))
        except ValueError:
            continue
    return lines


def first(lines: list[tuple[float, str]], needle: str, after: float) -> float | None:
    return next((t for t, text in lines if t >= after and needle in text), None)


def spawn_timeline(username: str, requested: float, created: str, started: str,
                   server_log: str, hub_log: str, proxy_log: str,
                   ready: float) -> dict[str, float | None]:
    """Seconds since *requested* (epoch) at the end of each of PHASES; None where the
    logs do not show it (for example, a server that logs nothing)."""
    server, hub, proxy = log_lines(server_log), log_lines(hub_log), log_lines(proxy_log)
    at = {
        "container created": docker_time(created),
        "container started": docker_time(started),
        "server imports done": server[0][0] if server else None,
        "server listening": first(server, " is running at:", requested),
        "hub sees it ready": first(hub, f"User {username} took ", requested),
        "route added": first(proxy, f"Route added /user/{username} ", requested),
        "API says ready": ready,
    }
    return {phase: None if at[phase] is None else at[phase] - requested for phase in PHASES}
