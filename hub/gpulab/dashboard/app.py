"""The tornado app: the page, its JSON endpoint and the OAuth callback.

Routes, under the service prefix (``/services/gpus/`` as a JupyterHub service):

    GET {prefix}?range=1h|1d|1w  the nvidia-smi-style page (OAuth login via the hub),
                                 with each GPU's history below the table
    GET {prefix}api/history?range=1h|1d|1w  the history as JSON (gpulab.dashboard.history)
    GET {prefix}api/gpus         the same view model as JSON (cookie or
                                 ``Authorization: token ...``); never a login redirect
    GET {prefix}oauth_callback   JupyterHub's OAuth callback

and, for hub admins only (the user model's ``admin`` flag; operators get 403):

    GET  {prefix}leases              every GPU lease: GPU, user, server, since, states
    GET  {prefix}api/leases          the same as JSON, with the GPU inventory and the
                                     gpus.yaml errors being ignored
    POST {prefix}api/leases/release  {"gpu_uuid", "user", "server"}: remove a stuck
                                     lease's container (409 if the hub runs that server)
    GET  {prefix}members             members and their login tokens (expiry, last use)
    GET  {prefix}api/members         the same as JSON
    POST {prefix}api/members         {"name", "expires"}: add the member if new and issue
                                     a login token (returned this once)
    POST {prefix}api/members/revoke  {"user", "token_id"}: revoke a login token
    POST {prefix}api/members/end-access {"user", "stop_server"}: revoke every credential
                                     an admin issued them, end their sessions, and
                                     optionally stop their server

The members pages call the hub as the signed-in admin (gpulab.dashboard.members).
For admins and operators (everyone who may see the dashboard):

    GET  {prefix}usage?month=YYYY-MM        GPU-hours per member and group, per day
    GET  {prefix}api/usage?month=YYYY-MM    the same as JSON
    GET  {prefix}api/usage.csv?month=...    the same as CSV (gpulab.dashboard.usage)

Access: the user (or service) must hold one of the hub auth's access scopes, by default
``access:services!service=gpus`` (admins have it; the operators group gets it from the
``gpulab-operators`` role). Someone the hub knows but who lacks it gets 403 with a page
(or JSON) that says what to ask for; nobody is let in because no scope was configured.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from jinja2 import Environment, PackageLoader
from jupyterhub.services.auth import (
    HubOAuth,
    HubOAuthCallbackHandler,
    HubOAuthenticated,
    UserNotAllowed,
)
from jupyterhub.utils import url_path_join
from markupsafe import Markup
from tornado import httputil, web

from gpulab.contract import DASHBOARD_SERVICE
from gpulab.dashboard.charts import gpu_chart
from gpulab.dashboard.history import RANGE_WORDS, PrometheusHistory, parse_range
from gpulab.dashboard.leases import LeaseAdmin, ReleaseRefused
from gpulab.dashboard.members import (
    HubMembers,
    MemberError,
    parse_end_access,
    parse_issue,
    parse_revoke,
)
from gpulab.dashboard.sources import SnapshotReader
from gpulab.dashboard.usage import (
    PrometheusUsage,
    UsageUnavailable,
    hub_groups,
    parse_month,
    usage_csv,
    usage_model,
)
from gpulab.dashboard.view import build_view, format_duration
from gpulab.hubapi import HubApi

log = logging.getLogger("gpulab.dashboard")

SERVICE_NAME = DASHBOARD_SERVICE


@dataclass(frozen=True)
class DashboardConfig:
    refresh_seconds: float = 5.0
    service_name: str = SERVICE_NAME


def make_templates() -> Environment:
    """Jinja2 over the package's templates, every value escaped."""
    return Environment(loader=PackageLoader("gpulab.dashboard", "templates"), autoescape=True)


def _phrase(status: int) -> str:
    """The status's standard reason (tornado's, since no handler here gives its own)."""
    return httputil.responses.get(status, "Unknown")


def _clock(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S UTC") if ts else "never"


def history_charts(history: dict[str, Any]) -> list[Markup]:
    """One SVG per GPU of a :func:`gpulab.dashboard.history.history_model` (escaped by
    ElementTree, so marked safe for the template)."""
    if history.get("error"):
        return []
    return [Markup(gpu_chart(g, history["start"], history["end"], history["step"]))
            for g in history["gpus"]]


def render_page(env: Environment, view: dict[str, Any], *, api_url: str, refresh_seconds: float,
                xsrf_token: str, user: str, leases_url: str | None = None,
                members_url: str | None = None, usage_url: str | None = None,
                history: dict[str, Any] | None = None, page_url: str = "") -> str:
    """The whole page for one view model (also used by tests without a server).
    *leases_url*, *members_url*: the admins' pages, linked from the header (None: no link).
    *history*: a :mod:`gpulab.dashboard.history` model, drawn below the table (None:
    no history section); *page_url*: this page, for the range selector's links."""
    return env.get_template("dashboard.html").render(
        view=view, api_url=api_url, refresh_seconds=f"{refresh_seconds:g}",
        xsrf_token=xsrf_token, user=user, updated_text=_clock(view.get("timestamp")),
        leases_url=leases_url, members_url=members_url, usage_url=usage_url,
        history=history, charts=history_charts(history) if history else [],
        history_updated=_clock(history.get("end")) if history else None,
        history_step=format_duration(history.get("step")) if history else None,
        range_words=RANGE_WORDS, page_url=page_url)


def render_leases(env: Environment, model: dict[str, Any], *, api_url: str, release_url: str,
                  dashboard_url: str, xsrf_token: str, user: str) -> str:
    """The admins' lease page for one :func:`gpulab.dashboard.leases.lease_model`."""
    return env.get_template("leases.html").render(
        model=model, api_url=api_url, release_url=release_url, dashboard_url=dashboard_url,
        xsrf_token=xsrf_token, user=user, updated_text=_clock(model.get("timestamp")))


class _Handler(HubOAuthenticated, web.RequestHandler):
    """Identifies the hub user once per request (async: no thread blocks on the hub API)
    and remembers whether someone known was refused, to tell 401 from 403."""

    def initialize(self, hub_auth: HubOAuth, reader: SnapshotReader, config: DashboardConfig,
                   templates: Environment, access_scopes: frozenset[str], hub: HubApi,
                   leases: LeaseAdmin | None = None,
                   members: HubMembers | None = None,
                   usage: PrometheusUsage | None = None,
                   history: PrometheusHistory | None = None) -> None:
        self.hub_auth = hub_auth
        self.reader = reader
        self.config = config
        self.templates = templates
        self.access_scopes = access_scopes
        self.hub = hub  # the hub's API with the service's own token
        self.leases = leases
        self.members = members
        self.usage = usage
        self.history = history
        # what went wrong on an admin or usage page, and what to do (the error page)
        self.page_error: tuple[str, str | None] | None = None
        self.denied_user: dict[str, Any] | None = None
        self.not_admin = False

    @property
    def is_admin(self) -> bool:
        return bool(self.current_user and self.current_user.get("admin") is True)

    def require_admin(self) -> dict[str, Any]:
        """The signed-in admin's model; 401/403 for anyone else."""
        if self.current_user is None:
            raise web.HTTPError(403 if self.denied_user is not None else 401)
        if not self.is_admin:
            self.not_admin = True
            raise web.HTTPError(403)
        return self.current_user

    @property
    def xsrf_text(self) -> str:
        token = self.xsrf_token
        return token.decode() if isinstance(token, bytes) else token

    def url(self, path: str) -> str:
        return url_path_join(self.hub_auth.base_url, path)

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
        if self.page_error:
            return self.page_error
        if status == 403 and self.not_admin:
            name = (self.current_user or {}).get("name")
            return (f"The GPU leases and the members page are for hub admins only, and "
                    f"{name!s} is not one. Operators see the GPU dashboard; ask an admin to "
                    "release a lease or issue a token.",
                    "Hub admins are listed under hub.admins in config/gpulab.yaml.")
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
        return (_phrase(status), None)


class _History:
    def history_range(self) -> str:
        """?range=1h|1d|1w, or 400 saying which ranges there are."""
        try:
            return parse_range(self.get_argument("range", None))
        except ValueError as e:
            self.page_error = (str(e), None)
            raise web.HTTPError(400) from None

    async def read_history(self, range_name: str) -> dict[str, Any] | None:
        """The history model (its ``error`` says when Prometheus did not answer); None
        without a Prometheus."""
        if self.history is None:
            return None
        return await self.history.read(range_name, datetime.now(UTC).timestamp())


class PageHandler(_History, _Handler):
    async def get(self) -> None:
        if self.current_user is None:
            if self.denied_user is not None:
                raise web.HTTPError(403)
            self.redirect(self.get_login_url())
            return
        range_name = self.history_range()
        # the table does not wait for Prometheus' range queries any longer than for itself
        snapshot, history = await asyncio.gather(self.reader.read(),
                                                 self.read_history(range_name))
        view = build_view(snapshot)
        self.write(render_page(
            self.templates, view,
            api_url=self.url("api/gpus"),
            refresh_seconds=self.config.refresh_seconds,
            xsrf_token=self.xsrf_text,
            user=self.current_user.get("name", ""),
            leases_url=self.url("leases") if self.leases and self.is_admin else None,
            members_url=self.url("members") if self.members and self.is_admin else None,
            usage_url=self.url("usage") if self.usage else None,
            history=history, page_url=self.hub_auth.base_url))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message, hint = self._refusal(status_code)
        if status_code >= 500 and status_code != 503:
            message, hint = "The dashboard failed; the service's log says why.", None
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(self.templates.get_template("error.html").render(
            status=status_code, reason=_phrase(status_code), message=message, hint=hint,
            hub_home=url_path_join(self.hub_auth.hub_prefix, "home")))


class LeasesPageHandler(PageHandler):
    """The admins' lease table, with a release button per lease."""

    async def get(self) -> None:
        if self.current_user is None and self.denied_user is None:
            self.redirect(self.get_login_url())
            return
        admin = self.require_admin()
        self.write(render_leases(
            self.templates, await self.leases.model(),
            api_url=self.url("api/leases"), release_url=self.url("api/leases/release"),
            dashboard_url=self.hub_auth.base_url, xsrf_token=self.xsrf_text,
            user=admin.get("name", "")))


class MembersPageHandler(PageHandler):
    """The admins' members page: add a member, issue, list and revoke login tokens."""

    async def get(self) -> None:
        if self.current_user is None and self.denied_user is None:
            self.redirect(self.get_login_url())
            return
        admin = self.require_admin()
        try:
            model = await self.members.model(self.hub_auth.get_token(self))
        except MemberError as e:
            self.page_error = (e.message, "If the hub refused (403), sign out of the hub and "
                                          "in again: the page acts with your own sign-in.")
            raise web.HTTPError(e.status) from None
        self.write(self.templates.get_template("members.html").render(
            model=model, api_url=self.url("api/members"),
            revoke_url=self.url("api/members/revoke"),
            end_access_url=self.url("api/members/end-access"),
            dashboard_url=self.hub_auth.base_url,
            leases_url=self.url("leases") if self.leases else None,
            xsrf_token=self.xsrf_text, user=admin.get("name", ""),
            updated_text=_clock(datetime.now(UTC).timestamp())))


class _Usage:
    async def usage_model(self) -> dict[str, Any]:
        """The month asked for (?month=YYYY-MM), or 400/503 with what went wrong."""
        if self.current_user is None:
            raise web.HTTPError(403 if self.denied_user is not None else 401)
        now = datetime.now(UTC)
        try:
            month = parse_month(self.get_argument("month", None), now.date())
        except ValueError as e:
            self.page_error = (str(e), None)
            raise web.HTTPError(400) from None
        try:
            per_day, groups, waited, jobs = await asyncio.gather(
                self.usage.month(month, now),
                hub_groups(self.hub),
                self.usage.waited(month, now),
                self.usage.job_hours(month, now))
        except UsageUnavailable as e:
            self.page_error = (f"No usage figures: {e}", "Prometheus keeps them "
                               "(gpulab-prometheus); its log says why it is down.")
            raise web.HTTPError(503) from None
        model = usage_model(month, per_day, groups, waited, jobs)
        first = month.replace(day=1)
        model["previous"] = (first - timedelta(days=1)).strftime("%Y-%m")
        following = (first + timedelta(days=32)).replace(day=1)
        model["next"] = following.strftime("%Y-%m") if following <= now.date() else None
        return model


class UsagePageHandler(_Usage, PageHandler):
    async def get(self) -> None:
        if self.current_user is None and self.denied_user is None:
            self.redirect(self.get_login_url())
            return
        model = await self.usage_model()
        self.write(self.templates.get_template("usage.html").render(
            model=model, page_url=self.url("usage"), csv_url=self.url("api/usage.csv"),
            dashboard_url=self.hub_auth.base_url, user=self.current_user.get("name", ""),
            updated_text=_clock(datetime.now(UTC).timestamp())))


class _JsonErrors(_Handler):
    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message, _ = self._refusal(status_code)
        if status_code >= 500 and status_code != 503:
            message = "the dashboard failed; the service's log says why"
        if status_code == 401:
            self.set_header("WWW-Authenticate", "token")
        self.finish({"status": status_code, "error": message})


class LeasesApiHandler(_JsonErrors):
    async def get(self) -> None:
        self.require_admin()
        self.write(await self.leases.model())


class ReleaseHandler(_JsonErrors):
    """Releases one stuck lease. Cookie sessions need the page's X-XSRFToken (HubAuth
    ignores the cookie of a POST without it); token callers do not."""

    async def post(self) -> None:
        admin = self.require_admin()
        try:
            body = json.loads(self.request.body or b"null")
        except ValueError:
            body = None
        fields = ("gpu_uuid", "user", "server")
        if (not isinstance(body, dict) or not all(isinstance(body.get(f, ""), str)
                                                  for f in fields)
                or not body.get("gpu_uuid") or not body.get("user")):
            self.set_status(400)
            self.finish({"status": 400, "error": 'Send JSON {"gpu_uuid": "GPU-...", "user": '
                                                 '"name", "server": ""} ("" = default server).'})
            return
        gpu, user, server = body["gpu_uuid"], body["user"], body.get("server", "")
        try:
            removed = await self.leases.release(gpu, user, server, admin=admin.get("name", "?"))
        except ReleaseRefused as e:
            log.info("admin %s: release of GPU %s of %s/%s refused (%s): %s",
                     admin.get("name"), gpu, user, server, e.status, e.message)
            self.set_status(e.status)
            self.finish({"status": e.status, "error": e.message})
            return
        who = f"{user}/{server}" if server else user
        self.finish({"status": 200, "released": {"gpu_uuid": gpu, "user": user,
                                                 "server": server},
                     "removed_containers": removed,
                     "message": f"Released GPU {gpu} of {who}: removed {', '.join(removed)}."})


class _MembersApi(_JsonErrors):
    async def act(self, what) -> None:
        """Run *what(admin, token, body)*, answering its MemberError as JSON."""
        admin = self.require_admin()
        try:
            body = json.loads(self.request.body or b"null")
        except ValueError:
            body = None
        try:
            await what(admin.get("name", "?"), self.hub_auth.get_token(self), body)
        except MemberError as e:
            log.info("admin %s: %s %s refused (%s): %s", admin.get("name"),
                     self.request.method, self.request.path, e.status, e.message)
            self.set_status(e.status)
            self.finish({"status": e.status, "error": e.message})


class MembersApiHandler(_MembersApi):
    async def get(self) -> None:
        self.require_admin()
        try:
            self.write(await self.members.model(self.hub_auth.get_token(self)))
        except MemberError as e:
            self.set_status(e.status)
            self.finish({"status": e.status, "error": e.message})

    async def post(self) -> None:
        async def issue(admin: str, token: str, body: Any) -> None:
            request = parse_issue(body)
            model = await self.members.issue(token, request)
            expires = model.get("expires_at") or "never"
            log.info("admin %s issued login token %s for %s%s (expires %s)", admin,
                     model.get("id"), request.name,
                     ", a new member" if model["created_user"] else "", expires)
            self.set_status(201)
            self.finish({"status": 201, "user": request.name, "token": model["token"],
                         "id": model.get("id"), "expires_at": model.get("expires_at"),
                         "created_user": model["created_user"],
                         "message": f"Login token {model.get('id')} for {request.name} "
                                    f"(expires {expires}). It is shown only now: give it "
                                    f"to {request.name}."})
        await self.act(issue)


class RevokeHandler(_MembersApi):
    async def post(self) -> None:
        async def revoke(admin: str, token: str, body: Any) -> None:
            user, token_id = parse_revoke(body)
            await self.members.revoke(token, user, token_id)
            log.info("admin %s revoked login token %s of %s", admin, token_id, user)
            self.finish({"status": 200, "message": f"Revoked login token {token_id} of {user}."})
        await self.act(revoke)


class EndAccessHandler(_MembersApi):
    async def post(self) -> None:
        async def end(admin: str, token: str, body: Any) -> None:
            user, stop_server = parse_end_access(body)
            result = await self.members.end_access(token, user, stop_server)
            log.info("admin %s ended the access of %s%s", admin, user,
                     " and stopped their server" if result.get("stopped_servers") else "")
            stopped = (" and stopped their server" if result.get("stopped_servers")
                       else "; their server keeps running until it is stopped"
                       if not stop_server else "")
            self.finish({"status": 200, **result,
                         "message": f"Ended the access of {user}: revoked "
                                    f"{len(result.get('revoked', []))} credential(s), ended "
                                    f"their sessions{stopped}."})
        await self.act(end)


class HistoryApiHandler(_History, _JsonErrors):
    async def get(self) -> None:
        if self.current_user is None:
            raise web.HTTPError(403 if self.denied_user is not None else 401)
        model = await self.read_history(self.history_range())
        if model is None:
            raise web.HTTPError(404)
        self.write(model)


class UsageApiHandler(_Usage, _JsonErrors):
    async def get(self) -> None:
        self.write(await self.usage_model())


class UsageCsvHandler(_Usage, _JsonErrors):
    async def get(self) -> None:
        model = await self.usage_model()
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition",
                        f'attachment; filename="gpulab-usage-{model["month"]}.csv"')
        self.finish(usage_csv(model))


class ApiHandler(_JsonErrors):
    """The view model as JSON, plus the raw snapshot under ``snapshot`` for scripts."""

    async def get(self) -> None:
        if self.current_user is None:
            raise web.HTTPError(403 if self.denied_user is not None else 401)
        snapshot = await self.reader.read()
        view = build_view(snapshot)
        view["refresh_seconds"] = self.config.refresh_seconds
        view["snapshot"] = snapshot
        self.write(view)


class CallbackHandler(HubOAuthCallbackHandler):
    def initialize(self, hub_auth: HubOAuth, **_: Any) -> None:
        self.hub_auth = hub_auth


def make_app(hub_auth: HubOAuth, reader: SnapshotReader,
             config: DashboardConfig = DashboardConfig(),
             cookie_secret: bytes | None = None,
             leases: LeaseAdmin | None = None,
             members: HubMembers | None = None,
             usage: PrometheusUsage | None = None,
             history: PrometheusHistory | None = None) -> web.Application:
    """The app under ``hub_auth.base_url`` (the service prefix). ``cookie_secret`` signs
    the OAuth token cookie; a random one (the default) only means users go through the
    hub's OAuth redirect again after a restart, without a prompt (oauth_no_confirm).
    *leases*, *members*: the admins' lease and members pages (left out when None);
    *history*: the GPUs' history under the table and at api/history (None: none)."""
    prefix = hub_auth.base_url.rstrip("/") + "/"
    scopes = frozenset(hub_auth.access_scopes) or frozenset(
        {f"access:services!service={config.service_name}"})
    args = {"hub_auth": hub_auth, "reader": reader, "config": config,
            "templates": make_templates(), "access_scopes": scopes,
            "hub": HubApi(hub_auth.api_url, hub_auth.api_token), "leases": leases,
            "members": members, "usage": usage, "history": history}
    routes = [
        (prefix.rstrip("/") or "/", web.RedirectHandler, {"url": prefix}),
        (prefix, PageHandler, args),
        (url_path_join(prefix, "api/gpus/?"), ApiHandler, args),
        (url_path_join(prefix, "api/history/?"), HistoryApiHandler, args),
        (url_path_join(prefix, "oauth_callback"), CallbackHandler, {"hub_auth": hub_auth}),
    ]
    if leases is not None:
        routes += [
            (url_path_join(prefix, "leases/?"), LeasesPageHandler, args),
            (url_path_join(prefix, "api/leases/?"), LeasesApiHandler, args),
            (url_path_join(prefix, "api/leases/release/?"), ReleaseHandler, args),
        ]
    if members is not None:
        routes += [
            (url_path_join(prefix, "members/?"), MembersPageHandler, args),
            (url_path_join(prefix, "api/members/?"), MembersApiHandler, args),
            (url_path_join(prefix, "api/members/revoke/?"), RevokeHandler, args),
            (url_path_join(prefix, "api/members/end-access/?"), EndAccessHandler, args),
        ]
    if usage is not None:
        routes += [
            (url_path_join(prefix, "usage/?"), UsagePageHandler, args),
            (url_path_join(prefix, "api/usage/?"), UsageApiHandler, args),
            (url_path_join(prefix, "api/usage.csv"), UsageCsvHandler, args),
        ]
    return web.Application(routes, cookie_secret=cookie_secret or os.urandom(32))
