"""One lease request's path through the code: GpulabSpawner._lease (the real method, on a
spawner made without a hub, its Docker a canned container list), with a booking ahead,
a member in line and GPU-hours on file. Prints the gpulab modules whose code runs, the
calls between them, any call from gpus/ up into another part, and where policy_for runs.

    .venv/bin/python bench/lease_path.py [HUB_DIR]

HUB_DIR: the hub/ folder of the tree to measure (default: this checkout's); for an older
commit, `git archive COMMIT hub | tar -x -C /tmp/old` and pass /tmp/old/hub.
"""
import asyncio
import logging
import sys
import tempfile
import time
import types
from collections import Counter
from pathlib import Path

hub = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parents[1] / "hub")
sys.path.insert(0, hub)
import gpulab.gpus.policy as pol  # noqa: E402
from gpulab.bookings.store import booking_store  # noqa: E402
from gpulab.contract import LABEL_GPUS, LABEL_MANAGED, LABEL_SERVER, LABEL_USER  # noqa: E402
from gpulab.environments import Environment  # noqa: E402
from gpulab.gpus.config import parse_gpus_config  # noqa: E402
from gpulab.gpus.leases import LeaseBook  # noqa: E402
from gpulab.line import usage as line_usage  # noqa: E402
from gpulab.line.store import line_store  # noqa: E402
from gpulab.spawn.spawner import GpulabSpawner  # noqa: E402

U = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(3)]
config = parse_gpus_config(
    "inventory:\n" + "".join(f"  - {{index: {i}, uuid: {u}}}\n" for i, u in enumerate(U)) +
    "defaults: {gpus: 1, max_gpus: 2, budget: {gpu_hours: 100, per: week}}\n")
tmp = Path(tempfile.mkdtemp())
line_path, bookings_path = tmp / "gpulab-line.sqlite", tmp / "gpulab-bookings.sqlite"
now = time.time()
bookings = booking_store(bookings_path)
_inv = LeaseBook(None).inventory(config, quiet=True)
bookings.make(config, _inv, "bob", [], 1, now + 1800, now + 5400, "bob")
line = line_store(line_path)
line.join("dan", "", 1, ())
line_usage.write(line.usage_path, now, None, {"week": {"ann": 1.0}}, {})

async def containers():
    return [{"Id": "c1", "State": "running", "Labels": {LABEL_MANAGED: "true", LABEL_USER: "cat",
             LABEL_SERVER: "", LABEL_GPUS: U[1]}}]

book = LeaseBook(containers)
class Walk(GpulabSpawner):
    name = ""
    lease_book = property(lambda self: book)

sp = Walk.__new__(Walk)
user = types.SimpleNamespace(name="ann", groups=[], admin=False)
for k, v in dict(user=user, user_options={"gpus": 1}, line_file=str(line_path),
                 bookings_file=str(bookings_path)).items():
    setattr(sp, k, v)
if "usage_file" in GpulabSpawner.class_trait_names():
    sp.usage_file = str(line.usage_path)
sp.log = logging.getLogger("walk")

sp._environment = Environment("default", "gpulab/singleuser:cpu")
sp._lab_config = ({"spawn.environments": [], "mail.smtp_host": ""}, config)

modules, policy, edges = Counter(), Counter(), Counter()
real = pol.policy_for
def profile(frame, event, arg):
    if event == "call" and "/gpulab/" in frame.f_code.co_filename:
        name = frame.f_code.co_filename.split("/gpulab/")[-1]
        modules[name] += 1
        back = frame.f_back
        if back is not None and "/gpulab/" in back.f_code.co_filename:
            caller = back.f_code.co_filename.split("/gpulab/")[-1]
            if caller != name:
                edges[(caller, name)] += 1
        if frame.f_code.co_name == "policy_for" and name == "gpus/policy.py":
            caller = frame.f_back.f_code.co_filename.split("/gpulab/")[-1]
            policy[f"{caller}:{frame.f_back.f_lineno}"] += 1
sys.setprofile(profile)
gpus = asyncio.run(sp._lease(config))
sys.setprofile(None)
print("leased:", [g.index for g in gpus])
print("gpulab modules entered:", len(modules))
for m in sorted(modules):
    print("   ", m)
print("module-to-module call edges:", len(edges))
up = [(a, b) for a, b in edges if a.startswith("gpus/") and not b.startswith("gpus/")
      and b not in ("contract.py",)]
print("calls from gpus/ up into other parts:", up)
print("bookings store reads:", sum(n for (a, b), n in edges.items() if b == "bookings/store.py"))
print("policy_for calls:", sum(policy.values()), dict(policy))
