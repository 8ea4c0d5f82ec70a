"""The integration tests' navigations through a network change (tests/integration/
browser.py): Chromium drops a navigation in flight with net::ERR_NETWORK_CHANGED when this
host's interfaces change, as the other lanes' containers start; a page's goto and reload
are tried again for that error only."""

from __future__ import annotations

import pytest
from playwright.sync_api import Error

from tests.integration.browser import NETWORK_CHANGED, _retrying


class PageDouble:
    """What _retrying uses of a Playwright page: its URL and wait_for_timeout."""

    url = "http://127.0.0.1:8000/hub/home"

    def __init__(self):
        self.waited = []

    def wait_for_timeout(self, ms):
        self.waited.append(ms)


def navigation(*errors):
    """A navigation that raises *errors* one per call, then returns "loaded"."""
    calls = []

    def navigate(*args, **kw):
        calls.append((args, kw))
        if len(calls) <= len(errors):
            raise Error(errors[len(calls) - 1])
        return "loaded"
    return navigate, calls


def test_a_reload_dropped_by_a_network_change_is_done_again():
    page, (reload, calls) = PageDouble(), navigation(f"Page.reload: {NETWORK_CHANGED}")
    with pytest.warns(UserWarning, match="reload of http://127.0.0.1:8000/hub/home"):
        assert _retrying(page, reload, timeout=5000) == "loaded"
    assert calls == [((), {"timeout": 5000})] * 2 and page.waited == [1000]


def test_a_goto_is_tried_three_times_at_most_and_other_errors_are_raised_at_once():
    page, (goto, calls) = PageDouble(), navigation(*[f"Page.goto: {NETWORK_CHANGED}"] * 3)
    with pytest.warns(UserWarning), pytest.raises(Error, match=NETWORK_CHANGED):
        _retrying(page, goto, "http://127.0.0.1:8000/hub/login")
    assert len(calls) == 3
    page, (goto, calls) = PageDouble(), navigation("net::ERR_CERT_AUTHORITY_INVALID")
    with pytest.raises(Error, match="CERT"):
        _retrying(page, goto, "https://127.0.0.1/hub/login")
    assert len(calls) == 1 and page.waited == []
