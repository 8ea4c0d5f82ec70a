"""The ``gpulab-ssh`` command: ``serve`` runs the gateway, ``keygen`` makes its host key once,
``fingerprint`` shows it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

import asyncssh

from gpulab.login.throttle import LockoutPolicy, Throttle
from gpulab.ssh import hostkey, limits
from gpulab.ssh.connection import serve
from gpulab.ssh.gateway import Gateway, GatewaySettings
from gpulab.ssh.terminal import resolve_below_the_hub

log = logging.getLogger("gpulab.ssh")


def _owner(value: str) -> tuple[int, int]:
    uid, _, gid = value.partition(":")
    return int(uid), int(gid or uid)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="gpulab-ssh", description="gpulab's SSH gateway: "
                                 "ssh into one's own running server")
    sub = ap.add_subparsers(dest="cmd")
    s = sub.add_parser("serve", help="run the gateway (the default)")
    s.add_argument("--listen", default="0.0.0.0:2222", help="host:port (default 0.0.0.0:2222)")
    s.add_argument("--hub-url", default=os.environ.get("GPULAB_SSH_HUB_URL",
                                                       "http://proxy:8000"),
                   help="the hub's proxy as the gateway reaches it (env GPULAB_SSH_HUB_URL, "
                        "default http://proxy:8000)")
    s.add_argument("--public-url", default=os.environ.get("GPULAB_SSH_PUBLIC_URL", ""),
                   help="the hub's address as members know it, for messages "
                        "(env GPULAB_SSH_PUBLIC_URL; example https://gpu.lab.example)")
    s.add_argument("--tls-trust", type=Path,
                   default=Path(os.environ["GPULAB_SSH_TLS_TRUST"])
                   if os.environ.get("GPULAB_SSH_TLS_TRUST") else None,
                   help="with an https:// hub URL: the certificate file the proxy serves, "
                        "trusted as it is (env GPULAB_SSH_TLS_TRUST)")
    s.add_argument("--host-key", type=Path,
                   default=Path("/run/secrets/ssh") / hostkey.KEY_FILE,
                   help="the private host key (made by `gpulab-ssh keygen`)")
    s.add_argument("--service-token-file", type=Path,
                   default=Path("/run/secrets/ssh-gateway-token"),
                   help="the hub service gpulab-ssh's token, for members' SSH keys "
                        "(`make up` makes secrets/ssh-gateway-token); without it, keys are "
                        "not offered and only login tokens sign in")
    s.add_argument("--throttle-db", type=Path,
                   default=Path("/var/lib/gpulab-ssh/throttle.sqlite"),
                   help="failed sign-ins and lockouts, kept across restarts")
    s.add_argument("--max-failures", type=int, default=5,
                   help="failures per username within --window that lock it (default 5)")
    s.add_argument("--max-failures-per-address", type=int, default=20,
                   help="failures per client address (IPv6: per /64) within --window "
                        "that lock it (default 20)")
    s.add_argument("--window", type=float, default=900, help="seconds (default 900)")
    s.add_argument("--lockout", type=float, default=900,
                   help="seconds of the first lockout, doubled for each next one (default 900)")
    s.add_argument("--max-lockout", type=float, default=86400,
                   help="longest lockout in seconds (default 86400)")
    k = sub.add_parser("keygen", help="make the host key once (kept afterwards); print its "
                                      "fingerprint")
    k.add_argument("--dir", type=Path, required=True)
    k.add_argument("--owner", type=_owner, help="uid[:gid] that will run the gateway")
    f = sub.add_parser("fingerprint", help="print the host key's type and SHA-256 fingerprint")
    f.add_argument("--host-key", type=Path, default=Path("/run/secrets/ssh") / hostkey.KEY_FILE)
    args = ap.parse_args(argv if argv is not None else (sys.argv[1:] or ["serve"]))
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("asyncssh").setLevel(logging.WARNING)  # its INFO lines are per packet
    if args.cmd == "keygen":
        done, fingerprint = hostkey.ensure(args.dir, args.owner)
        print(f"SSH host key {done}: {args.dir / hostkey.KEY_FILE} (ED25519 {fingerprint})")
        return
    if args.cmd == "fingerprint":
        key = asyncssh.read_private_key(str(args.host_key))
        print(f"ED25519 {key.get_fingerprint('sha256')}")
        return
    if not args.host_key.exists():
        sys.exit(f"gpulab-ssh: no host key at {args.host_key}; make one with "
                 f"`gpulab-ssh keygen --dir {args.host_key.parent}` (`make up` does)")
    user_policy = LockoutPolicy(max_failures=args.max_failures, window=args.window,
                                lockout=args.lockout, max_lockout=args.max_lockout,
                                forget_after=args.max_lockout)
    address_policy = LockoutPolicy(max_failures=args.max_failures_per_address,
                                   window=args.window, lockout=args.lockout,
                                   max_lockout=args.max_lockout, forget_after=args.max_lockout)
    throttle = Throttle(args.throttle_db, user_policy=user_policy,
                        address_policy=address_policy)
    try:
        how_much = limits.Limits.from_env()
    except ValueError as e:
        sys.exit(f"gpulab-ssh: {e} (see docs/security.md#ssh-gateway-limits)")
    log.info("limits: %s", how_much.describe())
    # Members' servers on names of their own (alice.gpu.lab.example) are all behind the
    # proxy, which Docker's DNS knows by the hub's name only.
    resolve_below_the_hub(args.hub_url)
    try:
        service_token = args.service_token_file.read_text().strip()
    except OSError as e:
        service_token = ""
        log.warning("SSH keys are off: cannot read the gateway's hub token (%s)", e)
    gateway = Gateway(GatewaySettings(args.hub_url, args.public_url, args.tls_trust,
                               service_token), throttle, how_much)
    asyncio.run(serve(args.listen, args.host_key, gateway))


if __name__ == "__main__":
    main()
