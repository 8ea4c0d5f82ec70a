"""gpulab's templates (the login page; the not-running page where a start from the spawn
form put her in line), rendered by a Jinja environment set up as JupyterHub's
(template_paths first, JupyterHub's own templates after, autoescape on)."""

from __future__ import annotations

import os
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PrefixLoader
from tornado import web

import gpulab

TEMPLATES = Path(gpulab.__file__).parent / "templates"
JUPYTERHUB_TEMPLATES = Path(sys.prefix) / "share" / "jupyterhub" / "templates"


@pytest.fixture(scope="module")
def env():
    assert (JUPYTERHUB_TEMPLATES / "page.html").exists(), JUPYTERHUB_TEMPLATES
    loader = ChoiceLoader(
        [
            PrefixLoader({"templates": FileSystemLoader([str(JUPYTERHUB_TEMPLATES)])}, "/"),
            FileSystemLoader([str(TEMPLATES), str(JUPYTERHUB_TEMPLATES)]),
        ]
    )
    return Environment(loader=loader, autoescape=True)  # as jupyterhub/app.py does


class Inputs(HTMLParser):
    """Collects <input> attributes and the text of the error area."""

    def __init__(self):
        super().__init__()
        self.inputs, self.labels, self._label = {}, [], False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "input":
            self.inputs[attrs.get("name") or attrs.get("id")] = attrs
        self._label = tag == "label"

    def handle_data(self, data):
        if self._label and data.strip():
            self.labels.append(data.strip())
            self._label = False


def render(env, **ns):
    context = {
        "static_url": lambda path, **kw: f"/hub/static/{path}",
        "base_url": "/hub/",
        "prefix": "/",
        "login_url": "/hub/login",
        "logout_url": "/hub/logout",
        "xsrf": "XSRF123",
        "xsrf_token": "XSRF123",
        "authenticator_login_url": "/hub/login?next=%2Fhub%2Fhome",
        "username": "",
        "login_error": None,
        "version_hash": "",
        "user": None,
        "services": [],
        "parsed_scopes": {},
        "authenticator": SimpleNamespace(sso=None),  # settings login.provider: none
        "next": "%2Fhub%2Fhome",  # JupyterHub passes it url-escaped
    }
    context.update(ns)
    return env.get_template(ns.pop("template", "login.html")).render(**context)


def test_gpulab_template_is_the_one_found(env):
    assert Path(env.get_template("login.html").filename).parent == TEMPLATES


def test_fields_and_help_text(env):
    html = render(env)
    parsed = Inputs()
    parsed.feed(html)
    assert parsed.labels[:2] == ["Username", "Personal access token"]
    token = parsed.inputs["password"]
    assert token["type"] == "password" and token["autocomplete"] == "off"
    assert parsed.inputs["username"]["type"] == "text"
    assert parsed.inputs["_xsrf"]["value"] == "XSRF123"
    assert "comes from the lab admin" in html
    assert 'method="post"' in html


def test_username_and_error_are_escaped(env):
    evil = '"><script>alert(1)</script>'
    html = render(env, username=evil, login_error=f"Invalid user {evil}")
    assert "<script>alert(1)</script>" not in html
    assert "&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in html
    parsed = Inputs()
    parsed.feed(html)
    assert parsed.inputs["username"]["value"] == evil  # round-trips as plain text


def test_next_in_form_action_is_escaped(env):
    html = render(env, authenticator_login_url='/hub/login?next="><img src=x onerror=alert(1)>')
    assert "<img src=x" not in html


def test_template_ships_with_the_package():
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert 'gpulab = ["templates/*.html"]' in pyproject
    assert os.access(TEMPLATES / "login.html", os.R_OK)


def test_without_a_provider_there_is_no_sso_button(env):
    assert 'id="sso-login"' not in render(env)


def test_the_sso_button_carries_next_and_escapes_the_label(env):
    sso = SimpleNamespace(login_service='Lab <script>alert(1)</script> "id"',
                          button_path="oidc/oauth_login")
    html = render(env, authenticator=SimpleNamespace(sso=sso))
    assert 'href="/hub/oidc/oauth_login?next=%2Fhub%2Fhome"' in html
    assert "Sign in with Lab &lt;script&gt;alert(1)&lt;/script&gt; &#34;id&#34;" in html
    assert "<script>alert(1)" not in html
    # the token form stays beside it
    parser = Inputs()
    parser.feed(html)
    assert {"username", "password", "_xsrf"} <= set(parser.inputs)


def test_with_a_directory_the_form_takes_its_password_and_has_no_button(env):
    sso = SimpleNamespace(login_service="Lab <b>LDAP</b>", button_path=None)
    html = render(env, authenticator=SimpleNamespace(sso=sso))
    assert 'id="sso-login"' not in html
    assert "Password (Lab &lt;b&gt;LDAP&lt;/b&gt;) or personal access token" in html



def failed_start(env, exc: web.HTTPError) -> str:
    """The not-running page as JupyterHub's spawn-pending page renders it after a failed
    start (pages.py: failed, the exception and its messages)."""
    return render(env, template="not_running.html", failed=True, exception=exc,
                  failed_message=getattr(exc, "jupyterhub_message", None),
                  failed_html_message=getattr(exc, "jupyterhub_html_message", None),
                  spawn_url="/hub/spawn/bob", server_name="")


def test_a_start_that_put_her_in_line_sends_her_home_from_the_not_running_page(env):
    # as gpulab.spawn.spawner raises it for the spawn form
    joined = web.HTTPError(303, "%s", "No 1 GPU free now: you are number 1 in line.")
    joined.headers, joined.joined_line = {"Location": "/hub/home"}, True
    joined.jupyterhub_html_message = ('No 1 GPU free now: you are number 1 in line. '
                                      '<a class="gpulab-line-home" href="/hub/home">Your '
                                      'home page</a> shows your place.')
    html = failed_start(env, joined)
    assert 'window.location.replace("/hub/home")' in html
    assert 'href="/hub/home">Your home page</a>' in html  # without JavaScript: the link
    assert "Spawn failed" not in html and "Relaunch" not in html


def test_any_other_failed_start_still_says_why_and_offers_to_relaunch(env):
    failed = web.HTTPError(500, "%s", "The image <gpulab/x> is missing")
    failed.jupyterhub_message = "The image <gpulab/x> is missing"
    html = failed_start(env, failed)
    assert "Spawn failed" in html and "Relaunch" in html
    assert "The image &lt;gpulab/x&gt; is missing" in html
    assert "window.location.replace" not in html
