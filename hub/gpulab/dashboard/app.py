"""The tornado app: the page, its JSON endpoint and the OAuth callback.

Routes, under the service prefix (``/services/gpus/`` as a JupyterHub service):

    GET {prefix}                 the nvidia-smi-style page (OAuth login via the hub)
    GET {prefix}api/gpus         the same view model as JSON (cookie or
                                 ``Authorization: token ...``); never a login redirect
    GET {prefix}oauth_callback   JupyterHub's OAuth callback

Access: the user (or service) must hold one of the hub auth's access scopes, by default
``access:services!service=gpus`` (admins have it; the operators group gets it from the
``gpulab-operators`` role). Someone the hub knows but who lacks it gets 403 with a page
(or JSON) that says what to ask for; nobody is let in because no scope was configured.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from jinja2 import Environment, PackageLoader
from jupyterhub.services.auth import (
    HubOAuth,
    HubOAuthCallbackHandler,
    HubOAuthenticated,
    UserNotAllowed,
)
from jupyterhub.utils import url_path_join
from tornado import web

from gpulab.dashboard.sources import SnapshotReader
from gpulab.dashboard.view import build_view

log = logging.getLogger("gpulab.dashboard")

SERVICE_NAME = "gpus"


@dataclass(frozen=True)
class DashboardConfig:
    refresh_seconds: float = 5.0
    service_name: str = SERVICE_NAME


def make_templates() -> Environment:
    """Jinja2 over the package's templates, every value escaped."""
    return Environment(loader=PackageLoader("gpulab.dashboard", "templates"), autoescape=True)


def render_page(env: Environment, view: dict[str, Any], *, api_url: str, refresh_seconds: float,
                xsrf_token: str, user: str) -> str:
    """The whole page for one view model (also used by tests without a server)."""
    ts = view.get("timestamp")
    updated = (datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S UTC") if ts else "never")
    return env.get_template("dashboard.html").render(
        view=view, api_url=api_url, refresh_seconds=f"{refresh_seconds:g}",
        xsrf_token=xsrf_token, user=user, updated_text=updated)


class _Handler(HubOAuthenticated, web.RequestHandler):
    """Identifies the hub user once per request (async: no thread blocks on the hub API)
    and remembers whether someone known was refused, to tell 401 from 403."""

    def initialize(self, hub_auth: HubOAuth, reader: SnapshotReader, config: DashboardConfig,
                   templates: Environment, access_scopes: frozenset[str]) -> None:
        self.hub_auth = hub_auth
        self.reader = reader
        self.config = config
        self.templates = templates
        self.access_scopes = access_scopes
        self.denied_user: dict[str, Any] | None = None

    @property
    def hub_scopes(self) -> set[str]:
        return set(self.access_scopes)

    async def prepare(self) -> None:
        self.current_user = None
        try:
            model = await self.hub_auth.get_user(self, sync=False)
        except web.HTTPError as e:
            if e.status_code < 500:
                raise
            # HubAuth already logged why; tell the user it is the hub, not them
            raise web.HTTPError(503, "hub API unreachable") from e
        if model is None:
            return
        try:
            self.current_user = self.check_hub_user(model)
        except UserNotAllowed:
            self.denied_user = model

    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Content-Security-Policy",
                        "default-src 'none'; script-src 'unsafe-inline'; "
                        "style-src 'unsafe-inline'; connect-src 'self'; "
                        "frame-ancestors 'self'; base-uri 'none'; form-action 'none'")

    def _refusal(self, status: int) -> tuple[str, str | None]:
        scope = " or ".join(sorted(self.access_scopes))
        if status == 403 and self.denied_user is not None:
            kind = self.denied_user.get("kind", "user")
            return (f"The {kind} {self.denied_user.get('name')!s} is signed in to the hub but "
                    f"may not see the GPU dashboard: it needs the scope {scope}.",
                    "Admins have it, and so do members of the hub's operators group (the "
                    "gpulab-operators role). Ask an admin to add you to hub.operators in "
                    "config/gpulab.yaml.")
        if status == 503:
            return ("The hub's API did not answer, so the dashboard cannot check who you "
                    "are. Try again in a moment; if it persists, the hub's log says why "
                    "(docker logs gpulab-hub).", None)
        if status == 401:
            return ("Not signed in. Open this page in a browser signed in to the hub, or "
                    "send 'Authorization: token <token>' with a token that has the scope "
                    f"{scope}.", None)
        return (self._reason, None)


class PageHandler(_Handler):
    async def get(self) -> None:
        if self.current_user is None:
            if self.denied_user is not None:
                raise web.HTTPError(403)
            self.redirect(self.get_login_url())
            return
        view = build_view(await self.reader.read())
        self.write(render_page(
            self.templates, view,
            api_url=url_path_join(self.hub_auth.base_url, "api/gpus"),
            refresh_seconds=self.config.refresh_seconds,
            xsrf_token=self.xsrf_token.decode() if isinstance(self.xsrf_token, bytes)
            else self.xsrf_token,
            user=self.current_user.get("name", "")))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message, hint = self._refusal(status_code)
        if status_code >= 500 and status_code != 503:
            message, hint = "The dashboard failed; the service's log says why.", None
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(self.templates.get_template("error.html").render(
            status=status_code, reason=self._reason, message=message, hint=hint,
            hub_home=url_path_join(self.hub_auth.hub_prefix, "home")))


class ApiHandler(_Handler):
    """The view model as JSON, plus the raw snapshot under ``snapshot`` for scripts."""

    async def get(self) -> None:
        if self.current_user is None:
            raise web.HTTPError(403 if self.denied_user is not None else 401)
        snapshot = await self.reader.read()
        view = build_view(snapshot)
        view["refresh_seconds"] = self.config.refresh_seconds
        view["snapshot"] = snapshot
        self.write(view)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message, _ = self._refusal(status_code)
        if status_code >= 500 and status_code != 503:
            message = "the dashboard failed; the service's log says why"
        if status_code == 401:
            self.set_header("WWW-Authenticate", "token")
        self.finish({"status": status_code, "error": message})


class CallbackHandler(HubOAuthCallbackHandler):
    def initialize(self, hub_auth: HubOAuth, **_: Any) -> None:
        self.hub_auth = hub_auth


def make_app(hub_auth: HubOAuth, reader: SnapshotReader,
             config: DashboardConfig = DashboardConfig(),
             cookie_secret: bytes | None = None) -> web.Application:
    """The app under ``hub_auth.base_url`` (the service prefix). ``cookie_secret`` signs
    the OAuth token cookie; a random one (the default) only means users go through the
    hub's OAuth redirect again after a restart, without a prompt (oauth_no_confirm)."""
    prefix = hub_auth.base_url.rstrip("/") + "/"
    scopes = frozenset(hub_auth.access_scopes) or frozenset(
        {f"access:services!service={config.service_name}"})
    args = {"hub_auth": hub_auth, "reader": reader, "config": config,
            "templates": make_templates(), "access_scopes": scopes}
    return web.Application(
        [
            (prefix.rstrip("/") or "/", web.RedirectHandler, {"url": prefix}),
            (prefix, PageHandler, args),
            (url_path_join(prefix, "api/gpus/?"), ApiHandler, args),
            (url_path_join(prefix, "oauth_callback"), CallbackHandler, {"hub_auth": hub_auth}),
        ],
        cookie_secret=cookie_secret or os.urandom(32),
    )
