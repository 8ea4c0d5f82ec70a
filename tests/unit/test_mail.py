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
from gpulab.mail import MailError, MailSettings, address_in_options, send, turn_message
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
