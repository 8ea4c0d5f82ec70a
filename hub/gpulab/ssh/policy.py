"""What the SSH gateway decides, as pure functions of what the hub answered.

The gateway asks the hub one question per sign-in, ``GET /hub/api/user`` with the
password as the token, and everything else follows from the answer:

* :func:`judge` says whether the token signs *this* SSH username in (it must name the
  same member, after the hub's own normalisation, and may open her server);
* :func:`server_location` says where the server she named is running (``ssh alice@``: her
  default server; ``ssh alice+train@``: her named server ``train``), or that it is not;
* the ``*_message`` functions are what the member reads in her terminal.

Standard library only; tested with literal hub answers (tests/unit/test_ssh_policy.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpulab.login.usernames import is_valid, normalize

# Outcomes of a sign-in. FAILED counts in the throttle (a wrong, revoked or another
# member's token); REFUSED does not (the member's own token that cannot open servers,
# or a hub that does not answer: no guessing involved).
OK = "ok"
FAILED = "failed"
REFUSED = "refused"


@dataclass(frozen=True)
class Verdict:
    outcome: str  # OK, FAILED or REFUSED
    reason: str  # for the gateway's log: never the token
    message: str = ""  # for the member (an SSH auth banner); "" says nothing


# Between a member's name and one of her named servers in an SSH username
# (``alice+train``): "+" is in no lab username, and scp and rsync read it as part of the user.
SERVER_SEPARATOR = "+"
# A named server's name as JupyterHub 6 accepts new ones (lowercase, digits and single
# hyphens, from a letter, at most 30 characters; the hub refuses any other)
SERVER_NAME = re.compile(r"[a-z](?:-?[a-z0-9])*")


def ssh_login(raw: str) -> tuple[str, str] | None:
    """``(member, server)`` an SSH username names: ``alice`` her default server (""),
    ``alice+train`` her named server ``train``; the member normalised as the hub's login
    normalises her (``Alice`` is ``alice``). None when it cannot name one."""
    who, plus, server = raw.partition(SERVER_SEPARATOR)
    name = normalize(who)
    if not is_valid(name) or (plus and not (len(server) <= 30
                                            and SERVER_NAME.fullmatch(server))):
        return None
    return name, server


def ssh_username(raw: str) -> str | None:
    """The member an SSH username names (see :func:`ssh_login`), or None."""
    login = ssh_login(raw)
    return login[0] if login else None


def shown_server(server: str) -> str:
    """"your server", or "your server train", in what she reads."""
    return f"your server {server}" if server else "your server"


def server_scopes(name: str, server: str = "") -> set[str]:
    """The scopes, any one of which lets a token open *name*'s *server*."""
    return {"access:servers", f"access:servers!user={name}",
            f"access:servers!server={name}/{server}"}


def judge(name: str, status: int, model: dict | None, server: str = "") -> Verdict:
    """Does the hub's answer to ``GET /hub/api/user`` (HTTP *status*, JSON *model*)
    sign in SSH user *name* (already normalised) to her *server*?"""
    if status in (401, 403):
        return Verdict(FAILED, "unknown, expired or revoked token")
    if status != 200 or not isinstance(model, dict):
        return Verdict(REFUSED, f"the hub answered HTTP {status}",
                       "The hub is not answering; try again in a minute.")
    if model.get("kind", "user") != "user" or model.get("name") != name:
        # a service's token, or another member's: as good as a wrong password
        return Verdict(FAILED, "token of another user or service")
    if not server_scopes(name, server) & set(model.get("scopes") or ()):
        return Verdict(REFUSED, "token may not open the member's server",
                       f"This token may not open {shown_server(server)} (it lacks the scope "
                       f"access:servers!user={name}). Sign in with your login token.")
    return Verdict(OK, "login token accepted")


def server_location(hub_url: str, model: dict, name: str = "") -> tuple[str, str] | None:
    """Where the gateway reaches the member's running server *name* ("" her default
    one): ``(origin, path)``, e.g. ``("http://proxy:8000", "/user/alice/")``; None when
    it is not running or not ready yet.

    With one origin per server (JupyterHub's subdomain_host), the hub gives its full URL
    (``https://alice.gpu.lab.example/user/alice/``): the origin is then the gateway's way
    to the proxy (*hub_url*'s scheme and port) under the server's own host name, which
    the proxy routes by and the certificate names (``*.gpu.lab.example``)."""
    server = (model.get("servers") or {}).get(name)
    if not server or not server.get("ready") or server.get("stopped"):
        return None
    url = server.get("url") or ""
    if url.startswith("/"):
        return (hub_url.rstrip("/"), url) if url.endswith("/") else None
    parts, hub = urlsplit(url), urlsplit(hub_url)
    if parts.scheme not in ("http", "https") or not parts.hostname or \
            not parts.path.startswith("/") or not parts.path.endswith("/"):
        return None
    hub_host = (hub.hostname or "").lower()
    if parts.hostname.lower() != hub_host and not parts.hostname.lower().endswith(
            "." + hub_host):
        return None  # never somewhere else than the hub's own names
    port = f":{hub.port}" if hub.port else ""
    return f"{hub.scheme}://{parts.hostname}{port}", parts.path


def not_running_message(public_url: str, pending: str | None = None, server: str = "",
                        others: tuple[str, ...] = (), member: str = "") -> str:
    """What a member reads when the server she named is not running (the gateway never
    starts it: the spawn form, with its choice of GPUs, is in the browser); *others*: her
    servers that are running, each with how to reach it."""
    where = f"{public_url.rstrip('/')}/hub/home" if public_url else "the hub's home page"
    which = shown_server(server).capitalize()
    if pending == "spawn":
        return (f"{which} is still starting; wait for it at {where}, then connect "
                "again.\r\n")
    running = "".join(f"Running: {shown_server(o)} (ssh "
                      f"{member + SERVER_SEPARATOR + o if o else member}@...).\r\n"
                      for o in others)
    return f"{which} is not running; start it at {where}, then connect again.\r\n{running}"


def pending_of(model: dict, server: str = "") -> str | None:
    return ((model.get("servers") or {}).get(server) or {}).get("pending")


def running_servers(model: dict) -> tuple[str, ...]:
    """Her servers that are ready, by name ("" her default one), as the hub's model
    shows them to the token that asked."""
    return tuple(sorted(n for n, s in (model.get("servers") or {}).items()
                        if s and s.get("ready") and not s.get("stopped")))


# Sessions without a terminal run as OpenSSH's sshd runs them: the member's shell
# ($SHELL in her server, bash in gpulab's image) with -c and the command, or reading
# a script from stdin when there is no command; sftp (and OpenSSH's scp, which speaks
# sftp) by the server's sftp-server.
SHELL_C = ["/bin/sh", "-c", 'exec "${SHELL:-/bin/sh}" -c "$1"', "sh"]
SHELL_READING_STDIN = ["/bin/sh", "-c", 'exec "${SHELL:-/bin/sh}"']
SUBSYSTEMS = {"sftp": ["/usr/lib/openssh/sftp-server"]}
# Where ssh -L/-D may connect: the member's own server's loopback, nothing else.
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}


class Unsupported(ValueError):
    """What the member asked for is not offered; the message says what is."""


def command_argv(command: str | None, subsystem: str | None) -> list[str]:
    """What a session without a terminal runs in the member's server."""
    if subsystem:
        if subsystem not in SUBSYSTEMS:
            raise Unsupported(f"The '{subsystem}' subsystem is not available here; sftp "
                              "is.\r\n")
        return SUBSYSTEMS[subsystem]
    if command is None:
        return SHELL_READING_STDIN
    return [*SHELL_C, command]


def forward_port(dest_host: str, dest_port: int) -> int:
    """The port of the member's server that ``ssh -L``/``-D`` to *dest_host*:*dest_port*
    reaches: only its own loopback. Anything else would make the gateway a way into
    the lab's network (other members' servers, the hub), so it is refused."""
    if dest_host.strip("[]").lower() not in LOOPBACK_NAMES:
        raise Unsupported(f"{NO_FORWARDING_ELSEWHERE} ({dest_host}:{dest_port} asked)")
    if not 0 < dest_port < 65536:
        raise Unsupported(f"no port {dest_port}")
    return dest_port


NO_FORWARDING_ELSEWHERE = ("gpulab-ssh forwards only to your own server's ports on "
                           "localhost (ssh -L 8080:localhost:8080)")
