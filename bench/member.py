"""What a member feels, in headless Chromium: sign-in to a usable JupyterLab, and to the
first executed cell that imports torch.

For each run a new member (with a login token, as the admin issues them) opens the login
page, types name and token and presses "Sign in"; the clock starts at that press. It
stops twice:

* **JupyterLab usable**: the lab's launcher is on screen (the hub started the server,
  the spawn page followed its progress and handed over, JupyterLab loaded);
* **first cell done**: from the launcher the member opens a Python 3 notebook, types
  `import torch` and a line of autograd, presses Shift+Enter, and its output appears.

Each member is new (a browser with nothing cached: the worst case); the same member then
signs out, their server is stopped, and they sign in again in the same browser (its
cache warm: the everyday case).

`--image` compares single-user images side by side in one run, as in bench/spawn.py;
`--collaboration` compares JupyterLab's real-time collaboration off and on
(gpulab.yaml's spawn.collaboration), members taking turns.
Run from the repository root with the stack up: `python -m bench.member --n 3`.
Needs Chromium and playwright (`make test` installs both).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.spawn import with_image, with_spawn_setting
from tests.chromium import CHROMIUM_ARGS, MEMBERS_CHROMIUM
from tests.integration.browser import (
    ARTIFACTS,
    run_in_new_notebook,
    sign_in_to_lab,
)
from tests.integration.stack import HUB_URL, Hub

CELL = ("import torch\nx = torch.ones(3, requires_grad=True)\n(2 * x).sum().backward()\n"
        "print('grad', x.grad.tolist())")
OUTPUT = "grad [2.0, 2.0, 2.0]"


def one_member(browser, hub: Hub) -> dict[str, float]:
    user = hub.create_user("member")
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(180_000)
    page = context.new_page()
    try:
        t0 = sign_in_to_lab(page, user.name, user.token)
        lab = time.monotonic()
        t_run = run_in_new_notebook(page, CELL, OUTPUT)
        done = time.monotonic()

        # The next day: server stopped, signed out; the browser keeps its cache.
        user.stop_server()
        page.goto(f"{HUB_URL}/hub/logout")
        t_again = sign_in_to_lab(page, user.name, user.token)
        again = time.monotonic() - t_again
        return {"JupyterLab usable": lab - t0,
                "first cell done": done - t0,
                "  the cell alone (import torch, backward)": done - t_run,
                "JupyterLab usable, signing in again (cache warm)": again}
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "bench-member-failed.png"))
        print(f"screenshot of {page.url}: artifacts/bench-member-failed.png")
        raise
    finally:
        context.close()
        hub.delete_user(user.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=3, help="members per image (default 3)")
    ap.add_argument("--image", action="append", default=[],
                    help="single-user image; repeat to compare side by side "
                         "(default: the one config/gpulab.yaml sets)")
    ap.add_argument("--collaboration", action="store_true",
                    help="compare spawn.collaboration false and true, members taking turns")
    args = ap.parse_args()
    if args.collaboration and args.image:
        raise SystemExit("bench: --collaboration or --image, not both")
    variants = ({"collaboration off": lambda: with_spawn_setting("collaboration", "false"),
                 "collaboration on": lambda: with_spawn_setting("collaboration", "true")}
                if args.collaboration else
                {image or "configured image": (lambda image=image: with_image(image)
                                               if image else None)
                 for image in args.image or [None]})
    from playwright.sync_api import sync_playwright

    hub = Hub()
    if not hub.is_up():
        raise SystemExit("the gpulab hub is not up: run `make up` first")
    results: dict[str, list[dict[str, float]]] = {}
    with sync_playwright() as p:
        # the full browser, as members run it (the tests drive the lighter headless shell)
        browser = p.chromium.launch(executable_path=MEMBERS_CHROMIUM, headless=True,
                                    args=CHROMIUM_ARGS)
        try:
            # members take turns between the variants, so that a host getting busier
            # weighs on each alike
            for _ in range(args.n):
                for label, configure in variants.items():
                    config = configure()
                    try:
                        results.setdefault(label, []).append(one_member(browser, hub))
                    finally:
                        if config:
                            config.restore()
        finally:
            browser.close()

    labels = list(results)
    width = max(14, *(len(label) for label in labels))
    print(f"\nseconds from pressing 'Sign in' (median of {args.n} members; min-max)")
    print(f"{'':50}" + "".join(f" {label:>{width}}" for label in labels))
    for measure in results[labels[0]][0]:
        cells = []
        for label in labels:
            xs = [run[measure] for run in results[label]]
            cells.append(f"{statistics.median(xs):.2f} ({min(xs):.1f}-{max(xs):.1f})")
        print(f"{measure:50}" + "".join(f" {cell:>{width}}" for cell in cells))


if __name__ == "__main__":
    main()
