"""Which Chromium the tests and benchmarks drive through Playwright, and with which flags.

The tests drive Debian's ``chromium-headless-shell``: Chromium's own headless build (the
same Blink and V8, the browser Playwright itself runs for headless tests), without the
full browser's window machinery. On a 2-core machine, where the integration lanes are
CPU-bound, it matters: test_browser.py's eight sign-ins and JupyterLab pages took 6.0 s
of CPU with it against 10.4-10.9 s with the full ``chromium`` (browser, driver and pytest
together; two rounds each, alternating), and 28 s against 34 s of wall time.

What a member feels (``bench/member.py``) is measured in the full browser, which is what
members run. ``GPULAB_CHROMIUM`` overrides either. Playwright never downloads a browser
here (``playwright install`` fails on this kind of machine): the system's is used.
"""

from __future__ import annotations

import os

# The tests' browser, and the one bench/member measures what a member feels in.
CHROMIUM = os.environ.get("GPULAB_CHROMIUM", "/usr/bin/chromium-headless-shell")
MEMBERS_CHROMIUM = os.environ.get("GPULAB_CHROMIUM", "/usr/bin/chromium")
# The flags that work as root on this kind of machine.
CHROMIUM_ARGS = [
    "--no-sandbox",  # the tests run as root
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def missing() -> str | None:
    """Why the tests' browser cannot be driven here (to skip with), or None when it can."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"{CHROMIUM} not found: apt-get install -y chromium-headless-shell"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "python package playwright not installed: pip install playwright"
    return None
