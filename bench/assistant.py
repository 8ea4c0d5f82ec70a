"""The lab assistant under load: requests per second and latency for 1, 5 and 20
members asking at once, through the hub, against the inference server asked directly.

Each member is a real hub user asking with her own token (a login token: it carries
the assistant's scope, as her server's token does) at the hub's published port,
``/hub/api/gpulab/assistant/v1/chat/completions``, one request after another; all the
members at once. The baseline, side by side in the same run, sends the same requests
straight to ``gpulab-assistant`` (its address on the internal network, which the host
reaches; members' servers cannot) with the hub's key: the difference is what the hub's
door costs (authentication, the checks, the forwarding).

The model is the suite's tiny random one (tests/integration/tiny_model.py) unless
``--model FILE`` names a GGUF file already in the stack's models folder: the tiny model
measures the path, a real one what members would wait. gpulab.yaml's assistant section
is set for the run (no minute's limit to speak of) and put back after.

    python -m bench.assistant                     # 1, 5, 20 members; 5 requests each
    python -m bench.assistant --members 1 5 20 --requests 10 --max-tokens 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
import yaml

from tests.integration.stack import HUB_URL, REPO, Hub, LabConfig, docker, wait_for
from tests.integration.tiny_model import write_tiny_model

TINY = "gpulab-bench-tiny.gguf"
QUESTION = "Why do we call x.unsqueeze(0) before model(x) in PyTorch?"


def models_dir() -> Path:
    mounts = json.loads(docker("inspect", "gpulab-assistant"))[0]["Mounts"]
    return Path(next(m["Source"] for m in mounts if m["Destination"] == "/models"))


def direct_url() -> str:
    ip = docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                "gpulab-assistant").strip()
    return f"http://{ip}:8080/v1/chat/completions"


def one_member(url: str, token: str, n: int, max_tokens: int) -> list[float]:
    """*n* questions one after another; each one's seconds."""
    took = []
    with requests.Session() as s:
        s.headers["Authorization"] = f"Bearer {token}"
        for _ in range(n):
            t0 = time.perf_counter()
            r = s.post(url, json={"messages": [{"role": "user", "content": QUESTION}],
                                  "max_tokens": max_tokens, "temperature": 0}, timeout=600)
            took.append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise SystemExit(f"{url}: HTTP {r.status_code} {r.text[:300]}")
    return took


def round_of(url: str, tokens: list[str], n: int, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(tokens)) as pool:
        runs = list(pool.map(lambda t: one_member(url, t, n, max_tokens), tokens))
    wall = time.perf_counter() - t0
    took = sorted(x for run in runs for x in run)
    return {"rps": len(took) / wall, "p50": statistics.median(took),
            "p95": took[min(len(took) - 1, int(0.95 * len(took)))], "max": took[-1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--members", type=int, nargs="+", default=[1, 5, 20])
    p.add_argument("--requests", type=int, default=5, help="per member")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--model", help="a GGUF file in the models folder (default: a tiny random one)")
    p.add_argument("--threads", type=int, default=2, help="assistant.threads")
    p.add_argument("--parallel", type=int, default=4, help="assistant.parallel")
    args = p.parse_args()

    hub, config = Hub(), LabConfig()
    model = None if args.model else write_tiny_model(models_dir() / TINY)
    doc = yaml.safe_load(config.original("gpulab.yaml")) or {}
    doc["assistant"] = {"model": args.model or TINY, "threads": args.threads,
                        "parallel": args.parallel, "requests_per_minute": 100000,
                        "max_tokens": args.max_tokens}
    users = []
    try:
        config.write("gpulab.yaml", yaml.safe_dump(doc))
        users = [hub.create_user("benchask") for _ in range(max(args.members))]
        status = f"{HUB_URL}/hub/api/gpulab/assistant"
        auth = {"Authorization": f"Bearer {users[0].token}"}
        wait_for(lambda: requests.get(status, headers=auth, timeout=10).json().get("ready"),
                 120, interval=0.5, what="the assistant to load its model")
        key = (REPO / "secrets" / "assistant-key").read_text().strip()
        via_hub = f"{status}/v1/chat/completions"
        direct = direct_url()
        one_member(via_hub, users[0].token, 2, args.max_tokens)  # warm both paths
        one_member(direct, key, 2, args.max_tokens)
        print(f"[bench.assistant] model {args.model or 'tiny random (0.4 MiB)'}, "
              f"{args.threads} threads, {args.parallel} at once, {args.max_tokens} tokens "
              f"per answer, {args.requests} requests per member")
        print(f"{'members':>8} {'path':<8} {'req/s':>7} {'p50 s':>7} {'p95 s':>7} "
              f"{'max s':>7}   hub/direct (p50)")
        for n in args.members:
            d = round_of(direct, [key] * n, args.requests, args.max_tokens)
            h = round_of(via_hub, [u.token for u in users[:n]], args.requests, args.max_tokens)
            for name, r in (("direct", d), ("via hub", h)):
                print(f"{n:>8} {name:<8} {r['rps']:>7.1f} {r['p50']:>7.3f} {r['p95']:>7.3f} "
                      f"{r['max']:>7.3f}" + (f"   {h['p50'] / d['p50']:.2f}x, "
                                            f"{h['rps'] / d['rps']:.2f}x the req/s"
                                            if name == "via hub" else ""))
    finally:
        config.restore()
        for u in users:
            hub.delete_user(u.name)
        if model:
            model.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
