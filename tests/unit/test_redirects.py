"""safe_next_url: only paths on this hub; and what JupyterHub's own check lets through."""

from __future__ import annotations

import logging

import pytest
from jupyterhub.handlers.base import BaseHandler
from tornado.httputil import HTTPHeaders

from gpulab.login.redirects import home_url, safe_next_url

HOME = "/hub/home"

# (next, safe_next_url(next, "/")) -- the attack table from the issue and the usual
# tricks browsers are known to "fix up" into an external URL.
ROOT_CASES = [
    ("/hub/home", "/hub/home"),
    ("/user/alice/lab?reset#x", "/user/alice/lab?reset#x"),
    ("/hub/spawn/alice/gpu%20box", "/hub/spawn/alice/gpu%20box"),
    ("/hub/token", "/hub/token"),
    ("https://evil.example/", HOME),
    ("http://evil.example", HOME),
    ("ftp://evil.example", HOME),
    ("//evil.example/", HOME),
    ("///evil.example/triple", HOME),
    ("\\\\evil.example/backslashes", HOME),
    ("/\\evil.example", HOME),
    ("\\/evil.example", HOME),
    ("/%5Cevil.example", HOME),
    ("/%2F/evil.example", HOME),
    ("javascript:alert(document.cookie)", HOME),
    ("JavaScript:alert(1)", HOME),
    ("data:text/html,<script>alert(1)</script>", HOME),
    ("/\t/evil.example", HOME),
    ("/\n/evil.example", HOME),
    ("/%09/evil.example", HOME),
    ("/hub/home\r\nSet-Cookie: x=1", HOME),
    ("/hub/\x00home", HOME),
    ("/\u2028/evil.example", HOME),
    (" //evil.example", HOME),
    ("relative/path", HOME),
    ("evil.example", HOME),
    ("/hub/../../etc", HOME),
    ("/hub/%2e%2e/x", HOME),
    ("", HOME),
    (None, HOME),
]


@pytest.mark.parametrize(("next_url", "expected"), ROOT_CASES)
def test_safe_next_url_at_root(next_url, expected):
    assert safe_next_url(next_url, "/") == expected


@pytest.mark.parametrize(
    ("next_url", "expected"),
    [
        ("/lab/hub/home", "/lab/hub/home"),
        ("/lab/user/alice/", "/lab/user/alice/"),
        ("/lab", "/lab"),
        ("/other/hub/home", "/lab/hub/home"),
        ("/laboratory/x", "/lab/hub/home"),
        ("/", "/lab/hub/home"),
        ("/lab/../other", "/lab/hub/home"),
    ],
)
def test_safe_next_url_under_a_base_url(next_url, expected):
    assert safe_next_url(next_url, "/lab/") == expected


def test_home_url_and_explicit_default():
    assert home_url("/") == "/hub/home"
    assert home_url("/lab/") == "/lab/hub/home"
    assert safe_next_url("//evil", "/", default="/hub/spawn") == "/hub/spawn"


class NextUrlCheckHost:
    """The few attributes BaseHandler._validate_next_url reads, for hub.example."""

    subdomain_host = ""
    settings: dict = {}
    log = logging.getLogger("test")

    class request:  # noqa: N801 - shaped like tornado's request
        host = "hub.example"
        protocol = "https"
        headers = HTTPHeaders()


def jupyterhub_check(url: str) -> str:
    return BaseHandler._validate_next_url(NextUrlCheckHost(), url)


@pytest.mark.parametrize(
    "url",
    [
        "https://evil.example/",
        "//evil.example/",
        "///evil.example/triple",
        "\\\\evil.example/backslashes",
        "javascript:alert(1)",
        "relative/path",
    ],
)
def test_jupyterhub_itself_refuses_these(url):
    assert jupyterhub_check(url) == ""


def test_jupyterhub_reduces_same_host_urls_to_paths():
    assert jupyterhub_check("https://hub.example//evil.example/") == "/evil.example/"


@pytest.mark.parametrize(
    "url",
    [
        "/hub/home\r\nSet-Cookie: x=1",  # tornado refuses the header: a 500, not a redirect
        "/hub/\x00home",
        "/\u2028/evil.example",
        "/hub/../../etc",
        "/\\evil.example",  # JupyterHub makes it the harmless path "/%5Cevil.example"
    ],
)
def test_what_jupyterhub_lets_through_safe_next_url_turns_into_home(url):
    passed = jupyterhub_check(url)
    assert passed != ""
    assert safe_next_url(passed, "/") == HOME


def test_jupyterhub_accepts_paths_outside_base_url_safe_next_url_does_not():
    assert jupyterhub_check("/other-app/") == "/other-app/"
    assert safe_next_url("/other-app/", "/lab/") == "/lab/hub/home"
