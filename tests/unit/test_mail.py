"""gpulab.mail: the addresses members give, the e-mail that tells one her turn came, and
its sending to an SMTP server (Python's own smtpd, a real server on loopback, in a
thread); the line service's use of it."""

from __future__ import annotations

import asyncio
import email
import smtplib
import threading
import warnings
from email.policy import default

import pytest

from gpulab.email_address import check_address
from gpulab.mail import (
    MailError,
    MailSettings,
    address_in_options,
    job_ended_message,
    send,
    turn_message,
)
from gpulab.settings import ConfigError, defaults, load_settings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # gone in 3.12; the image has 3.11
    import asyncore
    import smtpd

MAIL = defaults().with_values({"mail.smtp_host": "127.0.0.1", "mail.from": "gpulab@lab.example",
                               "mail.security": "none"})


@pytest.mark.parametrize("given, kept", [
    ("ann@lab.example", "ann@lab.example"),
    ("  ann.o'neil+gpu@cs.uni.example ", "ann.o'neil+gpu@cs.uni.example"),
])
def test_an_address_is_kept_as_given(given, kept):
    assert check_address(given) == kept


@pytest.mark.parametrize("given", [
    "ann", "ann@", "@lab.example", "ann@lab", "ann@@lab.example", "Ann <ann@lab.example>",
    "ann@lab.example, eve@evil.example", "ann@lab.example\r\nBcc: eve@evil.example",
    "a b@lab.example", "ann@-lab.example", 7, None, ["ann@lab.example"],
    "a" * 65 + "@lab.example", "ann@" + "l" * 250 + ".example",
])
def test_anything_else_is_refused_saying_what_an_address_is(given):
    with pytest.raises(ValueError, match="must be one e-mail address such as ann@lab.example"
                                         ", and nothing else"):
        check_address(given)


def test_an_address_goes_with_waiting_in_a_lab_that_sends_email():
    assert address_in_options({"wait": True, "email": "ann@lab.example"}, True, True) == \
        "ann@lab.example"
    assert address_in_options({"wait": "on", "email": ""}, True, True) == ""  # left empty
    assert address_in_options({"gpus": 1}, False, False) == ""
    assert address_in_options(None, False, True) == ""
    with pytest.raises(ValueError, match="This lab sends no e-mail"):
        address_in_options({"wait": True, "email": "ann@lab.example"}, True, False)
    with pytest.raises(ValueError, match="Tick \"Wait in line\""):
        address_in_options({"email": "ann@lab.example"}, False, True)
    # the form's field filled in without ticking the box: she did not ask to wait
    assert address_in_options({"email": "ann@lab.example"}, False, True, from_form=True) == ""
    with pytest.raises(ValueError, match="must be one e-mail address"):
        address_in_options({"wait": True, "email": "ann"}, True, True)
    # a job tells her how it ended: no waiting needed, but a lab that sends e-mail
    assert address_in_options({"job": "x", "email": "ann@lab.example"}, False, True,
                              job=True) == "ann@lab.example"
    with pytest.raises(ValueError, match="This lab sends no e-mail"):
        address_in_options({"job": "x", "email": "ann@lab.example"}, False, False, job=True)
    with pytest.raises(ValueError, match="must be one e-mail address"):
        address_in_options({"job": "x", "email": "ann\r\nBcc: e@x.example"}, False, True,
                           job=True)


def test_the_email_says_her_turn_came_until_when_and_where():
    m = turn_message(MAIL, "ann@lab.example", "ann", "", 2, 600, 1_800_000_000,
                     "https://gpu.lab.example/")
    assert (m["Subject"], m["From"], m["To"]) == (
        "Your turn for GPUs: your server is starting", "gpulab@lab.example", "ann@lab.example")
    body = m.get_content()
    assert "your server is starting, with 2 GPUs kept for you" in body, body
    # 1_800_000_000 is 2027-01-15 08:00 UTC; ten minutes later
    assert "Open it within 10 min of it being up (by 2027-01-15 08:10 UTC if it is up " \
           "at once): https://gpu.lab.example/hub/user/ann/" in body, body
    assert "its GPUs go to the next member waiting" in body
    named = turn_message(MAIL, "ann@lab.example", "ann", "train", 1, 60, 1_800_000_000)
    assert "your server train is starting, with 1 GPU kept" in named.get_content()
    assert "the lab's JupyterHub" in named.get_content()  # no URL known: no link


def test_the_email_says_how_her_job_ended_and_where_its_output_is():
    said = "python train.py exited 0 after 2 h 13 min, 2.2 GPU-hours"
    m = job_ended_message(MAIL, "ann@lab.example", "ann", "train1", said, 1_800_000_000,
                          "https://gpu.lab.example/")
    assert (m["Subject"], m["From"], m["To"]) == (
        "Your job train1 ended", "gpulab@lab.example", "ann@lab.example")
    assert m["Date"] == "Fri, 15 Jan 2027 08:00:00 +0000"
    body = m.get_content()
    assert f"your job train1: {said}." in body, body
    assert "~/jobs/train1/ (log and status.json)" in body, body
    assert "https://gpu.lab.example/hub/home" in body, body
    plain = job_ended_message(MAIL, "ann@lab.example", "ann", "j", said, 0).get_content()
    assert "Your home page on the lab's JupyterHub says the same." in plain


async def test_mail_settings_tell_her_how_her_job_ended(sink, tmp_path):
    settings = tmp_path / "gpulab.yaml"
    settings.write_text(f"mail:\n  smtp_host: 127.0.0.1\n  smtp_port: {sink.port}\n"
                        f"  security: none\n  from: gpulab@lab.example\n")
    mail = MailSettings(str(settings), str(tmp_path))
    assert await mail.tell_job_ended("ann@lab.example", "ann", "j1", "x exited 3 after 1 s, "
                                     "0.0 GPU-hours", 1e9)
    [(_, to, message)] = sink.got
    assert to == ["ann@lab.example"] and message["Subject"] == "Your job j1 ended"
    settings.write_text("mail: {smtp_host: ''}\n")  # the admin turned e-mail off since
    assert not await mail.tell_job_ended("ann@lab.example", "ann", "j1", "x", 1e9)
    assert len(sink.got) == 1


def test_mail_settings_are_checked_with_the_file_and_line(tmp_path):
    f = tmp_path / "gpulab.yaml"
    f.write_text("mail:\n  smtp_host: smtp.lab.example\n")
    with pytest.raises(ConfigError, match=r"gpulab.yaml:2.*without mail.from"):
        load_settings(f)
    f.write_text("mail:\n  smtp_host: smtp.lab.example\n  from: gpulab@lab.example\n"
                 "  security: ssl\n")
    with pytest.raises(ConfigError, match=r"gpulab.yaml:4.*starttls, tls or none"):
        load_settings(f)
    f.write_text("mail:\n  smtp_host: smtp.lab.example\n  from: gpulab@lab.example\n"
                 "  security: none\n  username: gpulab\n")
    with pytest.raises(ConfigError, match=r"gpulab.yaml:5.*password unencrypted"):
        load_settings(f)
    f.write_text("mail:\n  smtp_host: smtp.lab.example\n  from: Gpulab <gpulab@lab.example>\n")
    with pytest.raises(ConfigError, match=r"gpulab.yaml:3.*one plain e-mail address"):
        load_settings(f)
    f.write_text("mail:\n  smtp_host: smtp.lab.example\n  from: gpulab@lab.example\n"
                 "  smtp_port: 465\n  security: tls\n")
    s = load_settings(f)
    assert (s["mail.smtp_port"], s["mail.security"], s["mail.username"]) == (465, "tls", "")


class Sink(smtpd.SMTPServer):
    """An SMTP server on loopback that keeps what it is given."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), None)
        self.port = self.socket.getsockname()[1]
        self.got = []

    def process_message(self, peer, mailfrom, rcpttos, data, **kwargs):
        self.got.append((mailfrom, rcpttos, email.message_from_bytes(data, policy=default)))


@pytest.fixture
def sink():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        server = Sink()
    thread = threading.Thread(target=asyncore.loop, kwargs={"timeout": 0.05}, daemon=True)
    thread.start()
    yield server
    server.close()
    thread.join(timeout=5)


def test_the_email_reaches_the_smtp_server(sink, tmp_path):
    settings = MAIL.with_values({"mail.smtp_port": sink.port})
    send(settings, turn_message(settings, "ann@lab.example", "ann", "", 1, 600, 1e9),
         tmp_path)
    [(sender, to, message)] = sink.got
    assert (sender, to) == ("gpulab@lab.example", ["ann@lab.example"])
    assert message["Subject"] == "Your turn for GPUs: your server is starting"


def test_a_server_that_cannot_do_what_the_settings_say_is_said_clearly(sink, tmp_path):
    message = turn_message(MAIL, "ann@lab.example", "ann", "", 1, 600, 1e9)
    starttls = MAIL.with_values({"mail.smtp_port": sink.port, "mail.security": "starttls"})
    with pytest.raises(MailError, match="offers no STARTTLS.*set mail.security to tls"):
        send(starttls, message, tmp_path)
    login = MAIL.with_values({"mail.smtp_port": sink.port, "mail.username": "gpulab"})
    with pytest.raises(MailError, match="password cannot be read from secrets/smtp-password"):
        send(login, message, tmp_path)
    (tmp_path / "smtp-password").write_text("s3cret\n")
    with pytest.raises(MailError, match="offers no login .SMTP AUTH."):  # smtpd has none
        send(login, message, tmp_path)
    with smtplib.socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(MailError, match=rf"127.0.0.1:{port} did not take the e-mail"):
        send(MAIL.with_values({"mail.smtp_port": port}), message, tmp_path)
    assert sink.got == []


async def test_the_line_service_emails_her_when_it_starts_her_server(sink, tmp_path):
    from test_line import READY, RecordingHub, model, service

    settings = tmp_path / "gpulab.yaml"
    settings.write_text(f"mail:\n  smtp_host: 127.0.0.1\n  smtp_port: {sink.port}\n"
                        f"  security: none\n  from: gpulab@lab.example\n")
    mail = MailSettings(str(settings), str(tmp_path), "http://hub.example:8000")
    hub = RecordingHub([{**model(READY), "email": "bob@lab.example"},
                        {**model(READY), "user": "cy", "id": 8}])
    line = service(hub, tmp_path)
    line.mail = mail
    await line.check(now=100)
    await asyncio.gather(*line.mailing)  # sent beside the rounds
    assert [c[:2] for c in hub.calls] == [("offer", "bob"), ("start", "bob"),
                                         ("offer", "cy"), ("start", "cy")]
    [(_, to, message)] = sink.got  # cy gave no address
    assert to == ["bob@lab.example"]
    assert "http://hub.example:8000/hub/user/bob/" in message.get_content(), message

    # none when her server could not be started (the hub's pages tell her why), or when
    # the GPUs went to someone else in between (she waits on)
    sink.got.clear()
    for status in (503, 409):
        line = service(RecordingHub([{**model(READY), "email": "bob@lab.example"}],
                                    spawn_status=status), tmp_path)
        line.mail = mail
        await line.check(now=100)
        assert not line.mailing
    assert sink.got == []

    # an SMTP server that is down: logged, and the line goes on
    settings.write_text(settings.read_text().replace(str(sink.port), "1"))
    hub = RecordingHub([{**model(READY), "email": "bob@lab.example"}])
    line = service(hub, tmp_path)
    line.mail = mail
    await line.check(now=100)
    sending = list(line.mailing)
    # the round did not wait for it: the e-mail is still to be sent as the round ends
    assert [c[0] for c in hub.calls] == ["offer", "start"]
    assert sending and not any(t.done() for t in sending)
    assert await asyncio.gather(*sending) == [False]  # not told, and no exception


# ---------------------------------------------------------------- TLS and a login, for real
# aiosmtpd, a real SMTP server on loopback that speaks STARTTLS and TLS from the start and
# asks for a login, with a certificate from a CA made here (gpulab.login.tls's), as a
# lab's SMTP server with a private CA would: mail.ca_file trusts it.

PASSWORD = "s3cret-smtp"


class Keep:
    """aiosmtpd's handler: keeps each message; its authenticator takes one login."""

    def __init__(self):
        self.got, self.logins = [], []

    async def handle_DATA(self, server, session, envelope):
        self.got.append((envelope.mail_from, envelope.rcpt_tos,
                         email.message_from_bytes(envelope.content, policy=default)))
        return "250 OK"

    def authenticate(self, server, session, envelope, mechanism, auth_data):
        from aiosmtpd.smtp import AuthResult
        ok = (auth_data.login, auth_data.password) == (b"gpulab", PASSWORD.encode())
        self.logins.append((mechanism, auth_data.login.decode(), ok))
        return AuthResult(success=ok, handled=ok)  # not handled: aiosmtpd answers 535


def certificate(tmp_path, hostname: str):
    """(the CA's file, an ssl context that serves *hostname*'s certificate)."""
    import datetime as dt
    import ssl

    from cryptography.hazmat.primitives import serialization

    from gpulab.login.tls import make_ca, make_server

    now = dt.datetime.now(dt.UTC)
    ca, ca_key = make_ca(hostname, now)
    cert, key = make_server(hostname, now, ca, ca_key)
    pem = serialization.Encoding.PEM
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(pem))
    (tmp_path / "server.pem").write_bytes(cert.public_bytes(pem))
    (tmp_path / "server.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "server.pem", tmp_path / "server.key")
    return str(tmp_path / "ca.pem"), context


def free_port() -> int:
    with smtplib.socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def smtp_tls(tmp_path):
    """start(security, hostname): an aiosmtpd server on 127.0.0.1 for *security* ("starttls":
    STARTTLS required before anything; "tls": TLS from the start), with a login required
    over TLS, its certificate naming *hostname*; returns (its handler, the settings that
    reach it as localhost, with mail.ca_file)."""
    from aiosmtpd.controller import Controller

    running = []
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "smtp-password").write_text(PASSWORD + "\n")

    def start(security: str, hostname: str = "localhost"):
        ca_file, context = certificate(tmp_path, hostname)
        handler, port = Keep(), free_port()
        # a login only over TLS (aiosmtpd tells that by STARTTLS alone: from the start,
        # the whole connection is TLS anyway)
        tls = {"tls_context": context, "require_starttls": True, "auth_require_tls": True} \
            if security == "starttls" else {"ssl_context": context, "server_hostname": hostname,
                                            "auth_require_tls": False}
        controller = Controller(handler, hostname="127.0.0.1", port=port,
                                authenticator=handler.authenticate, **tls)
        controller.start()
        running.append(controller)
        settings = MAIL.with_values({"mail.smtp_host": "localhost", "mail.smtp_port": port,
                                     "mail.security": security, "mail.username": "gpulab",
                                     "mail.ca_file": ca_file})
        return handler, settings

    yield start
    for controller in running:
        controller.stop()


@pytest.mark.parametrize("security", ["starttls", "tls"])
def test_the_email_goes_over_tls_with_a_login(smtp_tls, tmp_path, security):
    handler, settings = smtp_tls(security)
    send(settings, turn_message(settings, "ann@lab.example", "ann", "", 1, 600, 1e9),
         tmp_path / "secrets")
    [(sender, to, message)] = handler.got
    assert (sender, to) == ("gpulab@lab.example", ["ann@lab.example"])
    assert message["Subject"] == "Your turn for GPUs: your server is starting"
    assert [(who, ok) for _, who, ok in handler.logins] == [("gpulab", True)]


@pytest.mark.parametrize("security", ["starttls", "tls"])
def test_a_certificate_for_another_name_is_refused_before_the_password_goes(
        smtp_tls, tmp_path, security):
    handler, settings = smtp_tls(security, hostname="smtp.lab.example")
    message = turn_message(settings, "ann@lab.example", "ann", "", 1, 600, 1e9)
    with pytest.raises(MailError, match=r"localhost:\d+ is not who it says: its certificate "
                                        r"Hostname mismatch"):
        send(settings, message, tmp_path / "secrets")
    assert handler.logins == [] and handler.got == []


def test_a_server_signed_by_a_ca_the_hub_does_not_trust_is_refused(smtp_tls, tmp_path):
    handler, settings = smtp_tls("starttls")
    system = settings.with_values({"mail.ca_file": ""})  # the system's CAs only
    with pytest.raises(MailError, match="is not who it says: its certificate unable to get "
                                        "local issuer certificate"):
        send(system, turn_message(system, "ann@lab.example", "ann", "", 1, 600, 1e9),
             tmp_path / "secrets")
    assert handler.logins == []


def test_a_wrong_password_is_said_without_the_password(smtp_tls, tmp_path):
    handler, settings = smtp_tls("starttls")
    (tmp_path / "secrets" / "smtp-password").write_text("not-it\n")
    with pytest.raises(MailError, match="refused the login of gpulab: 535") as refused:
        send(settings, turn_message(settings, "ann@lab.example", "ann", "", 1, 600, 1e9),
             tmp_path / "secrets")
    assert "not-it" not in str(refused.value)
    assert handler.got == []
