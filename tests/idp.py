"""A real OpenID Connect provider for the tests: npm's oidc-provider (tests/idp/), run with Node.

:class:`OidcProvider` starts ``tests/idp/oidc_provider.mjs`` on a loopback port, waits for
its discovery document, and stops it by its PID. Its accounts live in a JSON file that it
reads at every lookup: :meth:`OidcProvider.set_accounts` is "the lab's directory changed".
``make test-idp`` installs the npm package (``npm ci --prefix tests/idp``).
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tests.ports import free_port

HERE = Path(__file__).resolve().parent / "idp"
CLIENT_ID = "gpulab"


def missing() -> str | None:
    """Why the provider cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed (make test-idp installs it)"
    if not (HERE / "node_modules" / "oidc-provider").is_dir():
        return "tests/idp/node_modules is missing: make test-idp (npm ci --prefix tests/idp)"
    return None


@dataclass
class OidcProvider:
    run_dir: Path
    redirect_uris: list[str]
    host: str = "127.0.0.1"  # where it listens; its URLs name it
    port: int = field(default_factory=free_port)
    client_secret: str = field(default_factory=lambda: secrets.token_hex(24))
    process: subprocess.Popen | None = None

    @property
    def issuer(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def accounts_file(self) -> Path:
        return self.run_dir / "accounts.json"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "oidc.log"

    def set_accounts(self, accounts: dict) -> None:
        """The directory: {name: {"password", "groups", ["username"]}}; atomic."""
        tmp = self.accounts_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(accounts))
        tmp.replace(self.accounts_file)

    def settings(self) -> dict:
        """settings login.* for a hub that signs in here."""
        return {"login.provider": "oidc",
                "login.oidc_authorize_url": f"{self.issuer}/auth",
                "login.oidc_token_url": f"{self.issuer}/token",
                "login.oidc_userinfo_url": f"{self.issuer}/me",
                "login.oidc_client_id": CLIENT_ID,
                "login.oidc_scopes": ("openid", "profile", "email", "groups")}

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self, timeout: float = 20) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not self.accounts_file.exists():
            self.set_accounts({})
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "OIDC_HOST": self.host,
               "OIDC_PORT": str(self.port),
               "OIDC_ACCOUNTS": str(self.accounts_file), "OIDC_CLIENT_ID": CLIENT_ID,
               "OIDC_CLIENT_SECRET": self.client_secret,
               "OIDC_REDIRECT_URIS": ",".join(self.redirect_uris)}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(["node", str(HERE / "oidc_provider.mjs")],
                                            env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"oidc-provider exited with {self.process.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                r = requests.get(f"{self.issuer}/.well-known/openid-configuration", timeout=2)
                if r.status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"oidc-provider did not answer within {timeout} s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def require() -> None:
    """Skip (a failure under CI=true, tests/conftest.py) when the provider cannot run."""
    why = missing()
    if why:
        pytest.skip(why)
