"""Credentials in URLs are scrubbed from every line tornado writes about a request
(gpulab.login.logscrub); the hub's own request log is JupyterHub's, which scrubs too
(tests/integration/test_logs.py reads the real hub's log)."""

from __future__ import annotations

import logging

import pytest

from gpulab.login.logscrub import ScrubCredentials, install, scrub


@pytest.mark.parametrize("text, expected", [
    ("403 GET /hub/api/users/a?marker=1&token=abc123 (10.0.0.1): Missing or invalid "
     "credentials.", "403 GET /hub/api/users/a?marker=1&token=[secret] (10.0.0.1): "
                    "Missing or invalid credentials."),
    ("GET /hub/login?next=%2Fhub%2F&password=hunter2 (1.2.3.4)",
     "GET /hub/login?next=%2Fhub%2F&password=[secret] (1.2.3.4)"),
    ("GET /hub/oauth_callback?code=c0de&state=s7a7e (x)",
     "GET /hub/oauth_callback?code=[secret]&state=[secret] (x)"),
    ("GET /user/a/api?access_token=t#frag", "GET /user/a/api?access_token=[secret]#frag"),
    ("GET /hub/api/users?offset=0&limit=200 (x)", "GET /hub/api/users?offset=0&limit=200 (x)"),
    ("the token field is required", "the token field is required"),
])
def test_credential_parameters_become_secret(text, expected):
    assert scrub(text) == expected


def test_the_filter_rewrites_lines_whose_arguments_carry_a_url(caplog):
    logger = logging.getLogger("gpulab.test.logscrub")
    logger.addFilter(ScrubCredentials())
    with caplog.at_level(logging.WARNING, logger="gpulab.test.logscrub"):
        logger.warning("%d %s: %s", 403, "GET /x?token=s3cret (1.2.3.4)", "Forbidden")
    assert "s3cret" not in caplog.text and "GET /x?token=[secret]" in caplog.text


def test_install_puts_one_filter_on_tornados_loggers():
    install()
    install()
    for name in ("tornado.general", "tornado.application", "tornado.access"):
        assert sum(isinstance(f, ScrubCredentials)
                   for f in logging.getLogger(name).filters) == 1
