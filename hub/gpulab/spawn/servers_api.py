"""The hub's REST API for starting a server, less what a refused start leaves behind;
and where a job's server reports its end.

JupyterHub keeps a named server it was asked to start even when the start is refused:
each bad request (a job without a command, a server past max_servers, GPUs past
max_gpus) would leave a stopped entry on her home page, counted in
``named_server_limit_per_user`` until she deletes it. This handler is JupyterHub's own
(``POST /hub/api/users/NAME/servers/SERVER``), and removes the named server a refused
first start made, as JupyterHub's ``DELETE`` with ``{"remove": true}`` would. Registered
by gpulab.hubconfig, ahead of JupyterHub's own route (the authenticator's handlers).

``POST /hub/api/gpulab/jobs/USER/SERVER`` is how a job's server (the image's gpulab_job,
with its own token, which may stop her servers) tells the hub its job ended, before it
stops itself: her home page then says "Your job train1: python train.py exited 0 after
2 h 13 min, 2.2 GPU-hours", and where she gave an address with the job (``"email"``)
and the lab sends e-mail, she gets the same by e-mail.
"""

from __future__ import annotations

import asyncio
import time

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.scopes import needs_scope
from tornado import web

from gpulab import compat, notices
from gpulab.gpus.allocator import InvalidRequest
from gpulab.spawn.jobs import ended_text, parse_ended


class ServersAPIHandler(UserServerAPIHandler):
    async def post(self, user_name, server_name=""):
        user = self.find_user(user_name)
        new = bool(server_name) and user is not None and server_name not in user.orm_spawners
        try:
            await super().post(user_name, server_name)
        except web.HTTPError as e:
            if new and 400 <= e.status_code < 500 and await compat.forget_named_server(
                    self, user, server_name):
                self.log.info("Removed %s's named server %s: its first start was refused",
                              user.name, server_name)
            raise


class JobEndedAPIHandler(APIHandler):
    @needs_scope("servers")
    def post(self, user_name, server_name):
        user = self.find_user(user_name)
        if user is None or server_name not in user.orm_spawners:
            raise web.HTTPError(404, f"{user_name} has no server named {server_name!r}")
        options = user.spawners[server_name].user_options or {}
        if not options.get("job"):  # a notebook server has no job to end (nor to mail)
            raise web.HTTPError(400, f"{user_name}'s server {server_name!r} runs no job")
        try:
            command, state, code, seconds, hours = parse_ended(self.get_json_body())
        except InvalidRequest as e:
            raise web.HTTPError(400, str(e)) from None
        said, now = ended_text(command, state, code, seconds, hours), time.time()
        jobs = self.settings["gpulab-jobs"]
        notices.record_stopped(jobs["notices_file"], notices.Stopped(
            user.name, server_name, now, notices.JOB, said))
        self.log.info("%s's job %s: %s", user.name, server_name, said)
        # the address she gave with the job, checked when it was admitted
        address = options.get("email")
        mailed = isinstance(address, str) and bool(address) and jobs.get("mail") is not None
        if mailed:  # in the background: her server stops itself after this answer
            told = asyncio.ensure_future(jobs["mail"].tell_job_ended(
                address, user.name, server_name, said, now))
            _TELLING.add(told)
            told.add_done_callback(_TELLING.discard)
        self.write({"said": said, "emailing": mailed})


_TELLING: set[asyncio.Future] = set()  # e-mails on their way (a task needs a reference)


def start_handlers() -> list[tuple[str, type]]:
    """In place of JupyterHub's own start and stop API: these must come before the hub's
    handlers, which only an authenticator's ``get_handlers`` can do."""
    return [(r"/api/users/([^/]+)/servers/([^/]*)", ServersAPIHandler)]


def api_handlers() -> list[tuple[str, type]]:
    return [(r"/api/gpulab/jobs/([^/]+)/([^/]+)", JobEndedAPIHandler)]
