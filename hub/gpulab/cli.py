"""The ``gpulab`` command: check config, issue and revoke login tokens.

    gpulab config check [FILE...]       validate config/gpulab.yaml and config/gpus.yaml
    gpulab config describe              every setting, its default and what it does
    gpulab config get KEY [FILE]        one setting's value, checked (scripts: true/false)
    gpulab config changes --from OLD    what changed since the version that printed OLD
                                        with describe (used by `make upgrade`)
    gpulab assistant gpus [FILE]        the GPUs the lab assistant holds (used by `make up`)
    gpulab assistant in-use             those a member's server holds now (in the hub)
    gpulab token issue USER [--expires 90d] [--admin]
    gpulab token list USER
    gpulab token revoke USER TOKEN_ID [--stop-server]
    gpulab access end USER [--stop-server]   every credential an admin issued, revoked
    gpulab bootstrap-admin              first admin's token, once (used by `make up`)
    gpulab tls --hostname H --dir D     HTTPS certificates (gpulab.login.tls; used by `make up`)

Token commands talk to the hub's REST API as the ``gpulab-admin`` service: login
tokens through the admin-only endpoints of gpulab.login.tokens
(/hub/api/gpulab/login-tokens/USER), users through JupyterHub's own. Inside the hub
container they work as they are (``docker exec gpulab-hub gpulab token issue alice``);
elsewhere set GPULAB_HUB_API (e.g. http://127.0.0.1:8000/hub/api) and
GPULAB_API_TOKEN_FILE (e.g. secrets/api-token).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gpulab.assistant.gpus import assistant_gpus, held_by_members
from gpulab.gpus.config import load_gpus_config
from gpulab.hubapi import HubApi, HubApiError, SyncHubApi
from gpulab.live_config import file_kind
from gpulab.settings import ConfigError, describe, load_settings, parse_duration

DEFAULT_API = "http://127.0.0.1:8081/hub/api"
DEFAULT_TOKEN_FILE = "/srv/gpulab/secrets/api-token"
CONFIG_DIR = os.environ.get("GPULAB_CONFIG_DIR", "config")
DEFAULT_CONFIG = f"{CONFIG_DIR}/gpulab.yaml"
DEFAULT_GPUS = f"{CONFIG_DIR}/gpus.yaml"


class HubError(Exception):
    pass


def hub_from_env() -> SyncHubApi:
    """The hub's REST API as the ``gpulab-admin`` service (GPULAB_HUB_API,
    GPULAB_API_TOKEN_FILE)."""
    token_file = Path(os.environ.get("GPULAB_API_TOKEN_FILE", DEFAULT_TOKEN_FILE))
    try:
        token = token_file.read_text().strip()
    except OSError as e:
        raise HubError(
            f"cannot read the admin service token at {token_file}: {e.strerror}") from None
    return SyncHubApi(HubApi(os.environ.get("GPULAB_HUB_API", DEFAULT_API), token,
                             timeout=30))


def hub_error(e: HubApiError) -> str:
    """What the CLI says when the hub refused or did not answer."""
    if not e.status:
        return f"cannot reach the hub at {e.url}: {e.message}"
    return f"{e.method} {e.path}: HTTP {e.status}: {e.message}"


def ensure_user(hub: SyncHubApi, name: str, admin: bool = False) -> dict:
    """The user *name*, created if needed. *admin*: the user must be a hub admin
    already. Admins are exactly the users in hub.admins, applied at every hub start
    (JupyterHub refuses to let this service grant the right, and a start would take
    it back), so this only checks and says how, before anything is created."""
    user = hub.user(name)
    if admin and not (user and user.get("admin")):
        raise HubError(
            f"{name} is not a hub admin. Admins are the users listed under hub.admins "
            f"in config/gpulab.yaml: add {name} there, restart the hub (docker restart "
            f"gpulab-hub), then issue the token again.")
    return user or hub.create_user(name)


def _cmd_config_check(args) -> int:
    """Check each file with the loader its name calls for (gpus.yaml or settings). With
    --last-good DIR, an invalid file whose last good version is kept there is a warning:
    the lab goes on with that version (gpulab.live_config)."""
    failed = 0
    for path in args.files or [DEFAULT_CONFIG, DEFAULT_GPUS]:
        reader = file_kind(path, args.last_good)
        try:
            loader = load_gpus_config if Path(path).name.startswith("gpus") else load_settings
            loader(path)
        except ConfigError as e:
            kept = reader.saved_version(path) if args.last_good else None
            if kept is None:
                print(f"error: {e}", file=sys.stderr)
                failed = 1
            else:
                print(f"warning: {e}\n  This edit is refused: the lab goes on with the last "
                      f"good version of {Path(path).name}, saved {kept[1]}. Fix the file "
                      f"(gpulab config check), and it applies at the next spawn.",
                      file=sys.stderr)
            continue
        print(f"{path}: OK")
    return failed


def _settings_in_force(args):
    """The settings *args.file* holds, or (invalid) the last good version the running lab
    uses (config check warns of it); None, said, when there is neither."""
    try:
        return load_settings(args.file)
    except ConfigError as e:
        kept = file_kind(args.file, args.last_good).saved_version(args.file) \
            if args.last_good else None
        if kept is None:
            print(f"error: {e}", file=sys.stderr)
            return None
        return kept[0]


def _cmd_config_get(args) -> int:
    settings = _settings_in_force(args)
    if settings is None:
        return 1
    try:
        value = settings[args.key]
    except KeyError:
        print(f"error: no setting {args.key!r} (gpulab config describe lists them)",
              file=sys.stderr)
        return 2
    print(str(value).lower() if isinstance(value, bool) else value)
    return 0


def _cmd_assistant_in_use(args) -> int:
    """In the hub's container: the GPUs assistant.gpus names that a member's server holds
    now, one "GPU<TAB>member[/server]" line each (used by `make up`)."""
    import asyncio

    from gpulab import live_config
    from gpulab.gpus.allocator import leases_from_labels
    from gpulab.gpus.leases import LeaseBook, docker_lister

    settings = _settings_in_force(args)
    if settings is None:
        return 1
    refs = assistant_gpus(settings)
    if not refs or settings["hub.swarm"]:  # a Swarm's members hold services, elsewhere
        return 0
    try:
        config = live_config.gpus_file.load(args.gpus_file)
        lister = docker_lister()
        containers = asyncio.run(lister())
    except Exception as e:  # a gpus.yaml never valid, Docker unreachable: said, not raised
        print(f"error: {e}", file=sys.stderr)
        return 1
    inventory = LeaseBook(lister).inventory(config, quiet=True)
    for ref, lease in held_by_members(refs, inventory, leases_from_labels(containers)):
        print(f"{ref}\t{lease.user}{'/' + lease.server if lease.server else ''}")
    return 0


def _cmd_assistant_gpus(args) -> int:
    settings = _settings_in_force(args)
    if settings is None:
        return 1
    print(",".join(str(g) for g in assistant_gpus(settings)))
    return 0


def _cmd_config_describe(args) -> int:
    print(describe())
    return 0


def _cmd_config_changes(args) -> int:
    """What changes from the version whose describe output is in --from to this one."""
    from gpulab.upgrade import config_changes, parse_describe
    from gpulab.yamlfile import read_yaml

    old_text = sys.stdin.read() if args.old == "-" else Path(args.old).read_text()
    try:
        old = parse_describe(old_text)
    except ValueError as e:
        print(f"error: {args.old}: {e}", file=sys.stderr)
        return 1
    try:
        set_here = {".".join(path) for path, _ in read_yaml(args.file).leaves()}
    except (ConfigError, OSError):
        set_here = set()  # config check says why; nothing set is the cautious reading
    lines = config_changes(old, parse_describe(describe()), set_here)
    for line in lines or ["no setting was added or removed, and no default changed"]:
        print(line)
    return 0


def _print_token(user: str, token: dict) -> None:
    expires = token.get("expires_at") or "never"
    print(f"Login token for {user} (id {token['id']}, expires {expires}).")
    print("It is shown only this once; the hub keeps only a salted hash of it:")
    print()
    print(f"    {token['token']}")
    print()


def _cmd_token_issue(args) -> int:
    hub = hub_from_env()
    expires = parse_duration(args.expires) if args.expires else None
    user = ensure_user(hub, args.user.strip().lower(), admin=args.admin)
    _print_token(user["name"], hub.issue_login_token(user["name"], expires))
    return 0


def _cmd_token_list(args) -> int:
    for t in hub_from_env().login_tokens(args.user.strip().lower()):
        expires = t.get("expires_at") or "never"
        print(
            f"{t['id']}\tcreated {t.get('created')}\t"
            f"{'EXPIRED' if t.get('expired') else 'expires'} {expires}"
            f"\tlast used {t.get('last_activity') or 'never'}"
        )
    return 0


def _cmd_token_revoke(args) -> int:
    hub = hub_from_env()
    user = args.user.strip().lower()
    result = hub.revoke_login_token(user, args.token_id)
    print(f"revoked login token {args.token_id} of {user}")
    ended = result.get("ended_access")
    if ended is not None:
        api = ", ".join(ended.get("api_tokens") or []) or "none"
        print(f"{user} has no login token left: their hub sessions end now; deleted their "
              f"API tokens ({api}) and {ended.get('oauth_tokens', 0)} OAuth tokens")
    else:
        print(f"{user} still has {result.get('login_tokens_left')} login token(s): "
              f"gpulab token list {user}")
    if result.get("admin_api_tokens_left"):
        print(f"API tokens an admin made for {user} stand on their own and still work "
              f"({', '.join(result['admin_api_tokens_left'])}): gpulab access end {user} "
              f"revokes them too")
    if args.stop_server:  # every server of hers: her default one and her named ones
        servers = sorted((hub.user(user) or {}).get("servers") or {})
        stopped = [n or "default" for n in servers if hub.stop_server(user, n)]
        print(f"stopped {user}'s servers: {', '.join(stopped)}" if stopped
              else f"{user} has no running server")
    return 0


def _cmd_access_end(args) -> int:
    hub = hub_from_env()
    user = args.user.strip().lower()
    result = hub.end_access(user, args.stop_server)
    ended = result.get("ended_access") or {}
    print(f"ended the access of {user}: revoked {', '.join(result.get('revoked') or []) or 'no'}"
          f" credential(s); deleted their own API tokens "
          f"({', '.join(ended.get('api_tokens') or []) or 'none'}) and "
          f"{ended.get('oauth_tokens', 0)} OAuth tokens; ended {ended.get('shares', 0)} "
          f"share(s) of servers; their sessions end now")
    if args.stop_server:
        stopped = ", ".join(repr(n) for n in result.get("stopped_servers") or [])
        print(f"stopped servers: {stopped or 'none was running'}")
    else:
        print(f"{user}'s servers (if any) keep running, closed to them: gpulab access end "
              f"{user} --stop-server stops them")
    return 0


def _cmd_bootstrap_admin(args) -> int:
    # in the hub's container: the last good version while an edit is refused (make up
    # goes on then, and so does this)
    from .live_config import settings_file

    settings = settings_file.load(args.config)
    admins = settings["hub.admins"]
    if not admins:
        print("No hub.admins in the settings file: add your username there.", file=sys.stderr)
        return 1
    hub = hub_from_env()
    name = admins[0]
    ensure_user(hub, name, admin=True)
    if any(not t.get("expired") for t in hub.login_tokens(name)):
        print(f"Admin {name!r} already has a login token. A new one: "
              f"docker exec gpulab-hub gpulab token issue {name}")
        return 0
    _print_token(name, hub.issue_login_token(name, parse_duration(args.expires)))
    return 0


def _cmd_gpu_preflight(args) -> int:
    """Judge what scripts/gpu-preflight.sh observed (JSON on stdin or in a file)."""
    from gpulab.gpus.host import diagnose, observed_from_json

    text = sys.stdin.read() if args.observed == "-" else Path(args.observed).read_text()
    observed = observed_from_json(json.loads(text))
    problems = diagnose(observed)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        cuda = f"CUDA {observed.image_cuda}" if observed.image_cuda else "a CPU-only torch"
        print(f"GPUs ready: driver {observed.driver}, {len(observed.gpus)} GPU(s), a "
              f"container given {observed.probe_gpu} sees it, spawn.image has {cuda}")
    return 1 if problems else 0


def _cmd_tls(args) -> int:
    from gpulab.login.tls import ensure

    print(ensure(args.dir, args.hostname, args.cert, args.key, replace_ca=args.replace_ca,
                 subdomains=args.subdomains))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpulab", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    config = sub.add_parser("config", help="check or describe the settings file")
    csub = config.add_subparsers(dest="config_command", required=True)
    check = csub.add_parser("check", help="validate gpulab.yaml and gpus.yaml (or the FILES given)")
    check.add_argument("files", nargs="*", metavar="FILE")
    check.add_argument("--last-good", metavar="DIR",
                       help="where the running lab keeps each file's last good version "
                            "(the gpulab-last-good volume): an invalid file with a last "
                            "good version there is a warning, not an error")
    check.set_defaults(func=_cmd_config_check)
    csub.add_parser("describe", help="list every setting").set_defaults(func=_cmd_config_describe)
    changes = csub.add_parser("changes", help="what changed since another version: new "
                                               "settings, changed defaults, removed ones")
    changes.add_argument("--from", dest="old", required=True, metavar="FILE",
                         help="what the other version's `gpulab config describe` printed "
                              "(- for standard input)")
    changes.add_argument("file", nargs="?", default=DEFAULT_CONFIG,
                         help="the lab's gpulab.yaml: which changed defaults reach it")
    changes.set_defaults(func=_cmd_config_changes)
    get = csub.add_parser("get", help="print one setting's value (checked)")
    get.add_argument("key", help="e.g. hub.swarm")
    get.add_argument("file", nargs="?", default=DEFAULT_CONFIG)
    get.add_argument("--last-good", metavar="DIR",
                     help="with an invalid file, the value of its last good version kept "
                          "in DIR (the one the running lab uses)")
    get.set_defaults(func=_cmd_config_get)

    assistant = sub.add_parser("assistant", help="what the lab assistant holds")
    asub = assistant.add_subparsers(dest="what", required=True)
    gpus = asub.add_parser("gpus", help="the GPUs it holds, comma-separated (assistant.gpus "
                                        "while assistant.model is set; used by `make up`)")
    gpus.add_argument("file", nargs="?", default=DEFAULT_CONFIG)
    gpus.add_argument("--last-good", metavar="DIR",
                      help="with an invalid file, its last good version kept in DIR")
    gpus.set_defaults(func=_cmd_assistant_gpus)
    in_use = asub.add_parser("in-use", help="in the hub's container: those of its GPUs a "
                                            "member's server holds now (used by `make up`)")
    in_use.add_argument("file", nargs="?", default=DEFAULT_CONFIG)
    in_use.add_argument("--gpus-file", default=DEFAULT_GPUS)
    in_use.add_argument("--last-good", metavar="DIR",
                        default=os.environ.get("GPULAB_LAST_GOOD_DIR"),
                        help="with an invalid file, its last good version kept in DIR "
                             "(default: GPULAB_LAST_GOOD_DIR, the hub's)")
    in_use.set_defaults(func=_cmd_assistant_in_use)

    token = sub.add_parser("token", help="issue, list and revoke login tokens")
    tsub = token.add_subparsers(dest="token_command", required=True)
    issue = tsub.add_parser("issue", help="issue a login token (creates the user if needed)")
    issue.add_argument("user")
    issue.add_argument("--expires", default="90d", help="lifetime such as 90d or 12h; 0 = never")
    issue.add_argument("--admin", action="store_true",
                       help="only if the user is a hub admin (listed in hub.admins; made at "
                            "hub start): refuse otherwise, and say how to make one")
    issue.set_defaults(func=_cmd_token_issue)
    lst = tsub.add_parser("list", help="list a user's login tokens")
    lst.add_argument("user")
    lst.set_defaults(func=_cmd_token_list)
    revoke = tsub.add_parser("revoke", help="revoke a token at once")
    revoke.add_argument("user")
    revoke.add_argument("token_id")
    revoke.add_argument("--stop-server", action="store_true",
                        help="also stop the member's servers now (named ones too)")
    revoke.set_defaults(func=_cmd_token_revoke)

    access = sub.add_parser("access", help="end a member's access")
    asub = access.add_subparsers(dest="access_command", required=True)
    end = asub.add_parser("end", help="revoke every login token and API token an admin "
                                      "issued the member and end their sessions at once")
    end.add_argument("user")
    end.add_argument("--stop-server", action="store_true",
                     help="also stop the member's servers (otherwise they keep running, "
                          "closed to the member, until stopped)")
    end.set_defaults(func=_cmd_access_end)

    gpu = sub.add_parser("gpu-preflight", help="judge what scripts/gpu-preflight.sh saw on "
                                               "a GPU host (used by make up)")
    gpu.add_argument("observed", help="its JSON, or - for standard input")
    gpu.set_defaults(func=_cmd_gpu_preflight)

    tls = sub.add_parser("tls", help="certificates for HTTPS: the lab's, or a local CA's")
    tls.add_argument("--hostname", required=True, help="the name members open")
    tls.add_argument("--dir", required=True, type=Path, help="where server.crt/key go")
    tls.add_argument("--cert", type=Path, help="the lab's certificate chain (PEM)")
    tls.add_argument("--key", type=Path, help="the lab's private key (PEM)")
    tls.add_argument("--subdomains", action="store_true",
                     help="members' servers are at NAME.HOSTNAME: the lab's certificate must "
                          "name *.HOSTNAME too")
    tls.add_argument("--replace-ca", action="store_true",
                     help="when the kept local CA cannot stay (no name constraints, or not "
                          "for --hostname): keep its certificate as ca.crt.replaced-DATE, "
                          "delete its key, make a new CA; members must import the new ca.crt "
                          "and remove the old one")
    tls.set_defaults(func=_cmd_tls)

    boot = sub.add_parser("bootstrap-admin", help="issue the first admin's token, once")
    boot.add_argument("--config", default=DEFAULT_CONFIG)
    boot.add_argument("--expires", default="90d")
    boot.set_defaults(func=_cmd_bootstrap_admin)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (HubError, ConfigError, ValueError) as e:  # TlsError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 1
    except HubApiError as e:
        print(f"error: {hub_error(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
