"""E-mail to members through the lab's SMTP server: that their turn in line came, and
that their job ended.

gpulab.yaml's ``mail.*`` settings say which server and how (:data:`gpulab.settings.SETTINGS`);
the password, when ``mail.username`` is set, is the file ``secrets/smtp-password``
(:data:`PASSWORD_FILE`), never the settings file. A member gives her address herself,
when she joins the line (``"email"`` beside ``"wait": true``) or submits a job (beside
``"job"``).

:func:`address_in_options`, :func:`turn_message` and :func:`job_ended_message` are pure
(the address itself is checked by :mod:`gpulab.email_address`); :func:`send` is the one
place that speaks SMTP (blocking, with a timeout); :class:`MailSettings` is the async
shell around them, for the line service and the hub (gpulab.spawn.servers_api).
"""

from __future__ import annotations

import asyncio
import logging
import smtplib
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from pathlib import Path
from typing import Any

from gpulab import live_config
from gpulab.email_address import check_address
from gpulab.settings import duration_text
from gpulab.yamlfile import ConfigError

__all__ = ["MailError", "MailSettings", "address_in_options", "enabled", "job_ended_message",
           "send", "turn_message"]

log = logging.getLogger("gpulab.mail")

PASSWORD_FILE = "smtp-password"  # in the secrets folder
TIMEOUT = 20.0  # seconds for the SMTP server to answer each step


class MailError(Exception):
    """E-mail that could not be sent; ``str(e)`` says why, for the log."""


def enabled(settings: Mapping[str, Any]) -> bool:
    return bool(settings["mail.smtp_host"])


def address_in_options(options: object, wait: bool, mail_on: bool,
                       from_form: bool = False, job: bool = False) -> str:
    """Where a member asks to be told that her turn in line came or that her job ended
    (``"email"`` in her server's options, beside ``"wait": true`` or a *job*; the spawn
    form's field, left empty: ""), or ValueError saying what is wrong with it, for her.
    *mail_on*: the lab sends e-mail (:func:`enabled`). From the spawn form
    (*from_form*), an address typed without ticking "Wait in line" is not asked for: no
    e-mail, and no error."""
    raw = options.get("email") if isinstance(options, Mapping) else None
    if raw is None or raw == "" or (from_form and not wait):
        return ""
    if not mail_on:
        raise ValueError("This lab sends no e-mail (its admins have not set "
                         "mail.smtp_host): leave out \"email\". Your hub home page shows "
                         "your place in line, tells you when your turn comes and how your "
                         "jobs ended.")
    if not wait and not job:
        raise ValueError("An e-mail address is for waiting in line (it tells you when your "
                         "turn comes) or for a job (how it ended). Tick \"Wait in line\" "
                         "(through the REST API: \"wait\": true), or leave the address out.")
    return check_address(raw)


def turn_message(settings: Mapping[str, Any], to: str, user: str, server: str,
                 gpus: int, claim_window: int, offered_at: float,
                 hub_url: str = "") -> EmailMessage:
    """The e-mail telling *user* that the line started her server (*server*: "" for her
    default one) with her *gpus* GPUs at *offered_at*, and how long she has to open it
    once it is up (*claim_window* seconds; the deadline if it were up at once)."""
    deadline = datetime.fromtimestamp(offered_at + claim_window, UTC)
    where = (f"{hub_url.rstrip('/')}/hub/user/{user}/{server}" if hub_url
             else "the lab's JupyterHub (your home page there has a link to it)")
    named = f" {server}" if server else ""
    message = _message(settings, to, "Your turn for GPUs: your server is starting",
                       offered_at, "gpulab-line")
    message.set_content(
        f"Hello {user},\n\n"
        f"it is your turn in the lab's line for GPUs: your server{named} is starting, with "
        f"{gpus} GPU{'s' if gpus != 1 else ''} kept for you.\n\n"
        f"Open it within {duration_text(claim_window)} of it being up (by "
        f"{deadline:%Y-%m-%d %H:%M} UTC if it is up at once): {where}\n\n"
        f"If you do not, it is stopped and its GPUs go to the next member waiting.\n\n"
        f"-- gpulab (you gave this address when you joined the line)\n")
    return message


def job_ended_message(settings: Mapping[str, Any], to: str, user: str, server: str,
                      said: str, ended_at: float, hub_url: str = "") -> EmailMessage:
    """The e-mail telling *user* how her job (the named server *server*) ended: *said*,
    such as "python train.py exited 0 after 2 h 13 min, 2.2 GPU-hours"
    (gpulab.spawn.jobs.ended_text)."""
    home = (f"Your hub home page says the same: {hub_url.rstrip('/')}/hub/home" if hub_url
            else "Your home page on the lab's JupyterHub says the same.")
    message = _message(settings, to, f"Your job {server} ended", ended_at, "gpulab-job")
    message.set_content(
        f"Hello {user},\n\n"
        f"your job {server}: {said}.\n\n"
        f"Its output and exit status are in your home, in ~/jobs/{server}/ (log and "
        f"status.json); its GPUs went back to the lab when it ended. {home}\n\n"
        f"-- gpulab (you gave this address when you submitted the job)\n")
    return message


def _message(settings: Mapping[str, Any], to: str, subject: str, at: float,
             kind: str) -> EmailMessage:
    message = EmailMessage()
    message["Subject"] = subject
    message["From"] = settings["mail.from"]
    message["To"] = to
    message["Date"] = formatdate(at, usegmt=True)
    message["Message-ID"] = make_msgid(kind, settings["mail.from"].rpartition("@")[2])
    return message


def send(settings: Mapping[str, Any], message: EmailMessage,
         secrets_dir: str | Path) -> None:
    """Hand *message* to the lab's SMTP server (``mail.*``); MailError if it cannot be."""
    host, port = settings["mail.smtp_host"], settings["mail.smtp_port"]
    security, username = settings["mail.security"], settings["mail.username"]
    try:
        password = (Path(secrets_dir) / PASSWORD_FILE).read_text().strip() if username else ""
    except OSError as e:
        raise MailError(f"mail.username is set, but its password cannot be read from "
                        f"secrets/{PASSWORD_FILE}: {e.strerror}") from None
    server = f"the SMTP server {host}:{port}"
    try:
        # the server's certificate must name mail.smtp_host and chain to the system's CAs
        # (or mail.ca_file's): never an unverified TLS with the password in it
        context = ssl.create_default_context(cafile=settings["mail.ca_file"] or None)
        if security == "tls":
            smtp: smtplib.SMTP = smtplib.SMTP_SSL(host, port, timeout=TIMEOUT, context=context)
        else:
            smtp = smtplib.SMTP(host, port, timeout=TIMEOUT)
        with smtp:
            smtp.ehlo()
            if security == "starttls":
                if not smtp.has_extn("starttls"):
                    raise MailError(f"{server} offers no STARTTLS (mail.security: "
                                    f"starttls); set mail.security to tls or, for a relay "
                                    f"on the lab's own network, none")
                smtp.starttls(context=context)
                smtp.ehlo()
            if username:
                if not smtp.has_extn("auth"):
                    raise MailError(f"{server} offers no login (SMTP AUTH), and "
                                    f"mail.username is set: leave it empty for this server")
                smtp.login(username, password)
            smtp.send_message(message)
    except smtplib.SMTPAuthenticationError as e:
        raise MailError(f"{server} refused the login of {username}: {e.smtp_code} "
                        f"{e.smtp_error.decode(errors='replace')}") from None
    except ssl.SSLCertVerificationError as e:
        raise MailError(f"{server} is not who it says: its certificate {e.verify_message} "
                        f"(mail.smtp_host must be a name its certificate holds, signed by a "
                        f"CA the hub trusts: the system's or mail.ca_file)") from None
    except smtplib.SMTPRecipientsRefused as e:  # its text has the address: not logged
        codes = sorted({code for code, _ in e.recipients.values()})
        raise MailError(f"{server} refused the member's address ({codes})") from None
    except (OSError, smtplib.SMTPException) as e:
        raise MailError(f"{server} did not take the e-mail: {e}") from None


@dataclass(frozen=True)
class MailSettings:
    """Where the line service and the hub find how to send e-mail: gpulab.yaml (read at each
    e-mail: an admin's edit counts at once), the secrets folder, and the hub's URL as
    members open it ("" when unknown: the e-mail then names no link)."""

    settings_file: str
    secrets_dir: str
    hub_url: str = ""

    async def tell_turn(self, to: str, user: str, server: str, gpus: int,
                        claim_window: int, offered_at: float) -> bool:
        """E-mail *user* at *to* that her turn came; whether it went to the SMTP server
        (why not is logged: the line goes on without it)."""
        return await self._tell(
            "line", user, server, "their turn came",
            lambda settings: turn_message(settings, to, user, server, gpus, claim_window,
                                          offered_at, self.hub_url))

    async def tell_job_ended(self, to: str, user: str, server: str, said: str,
                             ended_at: float) -> bool:
        """E-mail *user* at *to* how her job *server* ended (*said*); whether it went."""
        return await self._tell(
            "jobs", user, server, "how their job ended",
            lambda settings: job_ended_message(settings, to, user, server, said, ended_at,
                                               self.hub_url))

    async def _tell(self, part: str, user: str, server: str, what: str,
                    message: Callable[[Mapping[str, Any]], EmailMessage]) -> bool:
        who = f"{user}:{server}" if server else user
        try:
            settings = live_config.settings_file.load(self.settings_file)
        except ConfigError as e:
            log.warning("%s: %s not told by e-mail: %s", part, who, e)
            return False
        if not enabled(settings):
            log.info("%s: %s not told by e-mail: mail.smtp_host is not set (any more)",
                     part, who)
            return False
        try:
            await asyncio.to_thread(send, settings, message(settings), self.secrets_dir)
        except MailError as e:
            log.warning("%s: %s not told by e-mail: %s", part, who, e)
            return False
        log.info("%s: told %s by e-mail %s", part, who, what)
        return True
