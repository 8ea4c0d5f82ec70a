"""Credentials never reach the hub's log, whichever logger writes the line.

JupyterHub's request log scrubs credential parameters from URLs (``token=[secret]``),
but tornado writes its own lines about failed requests with the raw URL: an
``HTTPError`` with a message (every 403 "Missing or invalid credentials") on
``tornado.general``, an uncaught exception on ``tornado.application``. Seen on the hub:
a member's token sent in a URL appeared whole in the warning beside the scrubbed
request line. :class:`ScrubCredentials` rewrites any such line; :func:`install` puts it
on those loggers (``gpulab.hubconfig`` does, at the hub's start).
"""

from __future__ import annotations

import logging
import re

# JupyterHub's (jupyterhub.log.SCRUB_PARAM_KEYS), and "password" (gpulab's login form
# refuses it in a URL: gpulab.login.auth.CREDENTIAL_PARAMS)
SCRUBBED = ("token", "auth", "key", "code", "state", "_xsrf", "password")
_PARAM = re.compile(r"([?&;][^=&\s]*(?:" + "|".join(map(re.escape, SCRUBBED))
                    + r")[^=&\s]*=)[^&\s#]*", re.IGNORECASE)
LOGGERS = ("tornado.general", "tornado.application", "tornado.access")


def scrub(text: str) -> str:
    """*text* with the value of every credential-like URL parameter as ``[secret]``."""
    return _PARAM.sub(r"\1[secret]", text)


class ScrubCredentials(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        scrubbed = scrub(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, ()
        return True


def install(names: tuple[str, ...] = LOGGERS) -> None:
    """Scrub every line the loggers *names* write (idempotent)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ScrubCredentials) for f in logger.filters):
            logger.addFilter(ScrubCredentials())
