"""The hub's REST API for starting a server, less what a refused start leaves behind.

JupyterHub keeps a named server it was asked to start even when the start is refused:
each bad request (a job without a command, a server past max_servers, GPUs past
max_gpus) would leave a stopped entry on her home page, counted in
``named_server_limit_per_user`` until she deletes it. This handler is JupyterHub's own
(``POST /hub/api/users/NAME/servers/SERVER``), and removes the named server a refused
first start made, as JupyterHub's ``DELETE`` with ``{"remove": true}`` would. Registered
by gpulab.hubconfig, ahead of JupyterHub's own route (the authenticator's handlers).
"""

from __future__ import annotations

from jupyterhub.apihandlers.users import UserServerAPIHandler
from tornado import web

from gpulab import compat


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


def api_handlers() -> list[tuple[str, type]]:
    return [(r"/api/users/([^/]+)/servers/([^/]*)", ServersAPIHandler)]
