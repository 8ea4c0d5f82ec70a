"""config/gpus.yaml: the shipped example, the schema, and file:line errors; and the
policy read from it (gpulab.gpus.policy: precedence of defaults, groups and users)."""

import re
from pathlib import Path

import pytest

from gpulab.gpus.config import (
    ConfigError,
    GpuEntry,
    Pin,
    Pool,
    load_gpus_config,
    parse_gpus_config,
)
from gpulab.gpus.policy import Policy, all_pins, pin_matches, policy_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config" / "gpus.yaml"

U0 = "GPU-00000000-0000-0000-0000-000000000000"
U1 = "GPU-11111111-1111-1111-1111-111111111111"

TWO_GPUS = f"""\
inventory:
  - {{index: 0, uuid: {U0}, model: A100}}
  - {{index: 1, uuid: {U1}, model: T4}}
"""


def test_shipped_example_is_valid_and_works_without_gpus():
    c = load_gpus_config(EXAMPLE)
    assert c.auto is True and c.gpus == ()
    assert c.default_gpus == 0 and c.default_max_gpus == 1
    assert policy_for(c, "anyone") == Policy(gpus=0, max_gpus=1, pools=("default",))


def test_shipped_commented_examples_are_valid_when_uncommented(tmp_path):
    text = EXAMPLE.read_text()
    text = text.replace("\ninventory: auto", "\n# inventory: auto", 1)
    text = text.replace("\n# inventory:\n", "\ninventory:\n", 1)
    text = re.sub(r"(?m)^#   ", "  ", text)
    path = tmp_path / "gpus.yaml"
    path.write_text(text)
    c = load_gpus_config(path)
    assert [g.index for g in c.gpus] == [0, 1, 2, 3, 4, 5, 5]  # 5: two MIG devices
    assert c.gpus[3].mode == "exclusive" and c.gpus[4].reserved
    assert c.pools["small"] == Pool("small", "shared", 4, c.pools["small"].description)
    assert policy_for(c, "bob", ["visitors"]).no_gpu is False  # users: lifts the group's no_gpu
    assert policy_for(c, "eve", ["visitors"]).no_gpu is True
    assert policy_for(c, "carol", ["staff", "students"]).max_gpus == 4
    assert policy_for(c, "alice").pinned[0].ref.startswith("GPU-9c9c")


def test_missing_file():
    with pytest.raises(ConfigError, match="nope.yaml: file not found"):
        load_gpus_config("/nonexistent/nope.yaml")
    assert load_gpus_config("/nonexistent/nope.yaml", missing_ok=True).auto is True


@pytest.mark.parametrize("text", ["", "inventory: auto\n", "pools:\ngroups:\nusers:\n"])
def test_empty_sections_give_defaults(text):
    c = parse_gpus_config(text)
    assert c.auto and c.default_gpus == 0 and c.default_max_gpus == 1
    assert list(c.pools) == ["default"] and c.groups == () and c.users == ()


def test_explicit_inventory_with_pools_and_modes():
    c = parse_gpus_config(
        f"""\
pools:
  big: {{mode: exclusive, description: training}}
  small: {{mode: shared, max_users: 4}}
inventory:
  - {{index: 1, uuid: {U1}, model: T4, pool: small, max_users: 2}}
  - {{index: 0, uuid: {U0}, pool: big, reserved: true}}
"""
    )
    assert not c.auto
    assert c.gpus == (
        GpuEntry(1, U1, "T4", "small", None, 2, False, line=5),
        GpuEntry(0, U0, "", "big", None, None, True, line=6),
    )
    assert c.pools["small"] == Pool("small", "shared", 4)
    assert c.pools["big"] == Pool("big", "exclusive", 1, "training")


@pytest.mark.parametrize(
    "groups, user_entry, expected",
    [
        # no groups, no entry: defaults
        ([], "", Policy(gpus=0, max_gpus=1, pools=("default", "a", "b"))),
        # groups combine generously
        (["g2", "g1"], "", Policy(gpus=1, max_gpus=3, pools=("a", "b"))),
        # a group the file does not know changes nothing
        (["zzz"], "", Policy(gpus=0, max_gpus=1, pools=("default", "a", "b"))),
        # no_gpu in any group wins over the others
        (["g1", "deny"], "", Policy(0, 0, (), (), True)),
        # the user's own entry replaces each field it sets
        (["g1"], "{max_gpus: 1}", Policy(gpus=1, max_gpus=1, pools=("a",))),
        (["deny"], "{no_gpu: false}", Policy(gpus=0, max_gpus=1, pools=("default", "a", "b"))),
        ([], "{no_gpu: true}", Policy(0, 0, (), (), True)),
        # pins raise the quota and the default count to their number
        ([], f"{{pinned: [{U0}, 1]}}",
         Policy(gpus=2, max_gpus=2, pools=("default", "a", "b"),
                pinned=(Pin(U0, 10), Pin(1, 10)))),
        # a default above the user's max is capped, not an error
        ([], "{max_gpus: 0}", Policy(gpus=0, max_gpus=0, pools=("default", "a", "b"))),
    ],
)
def test_policy_precedence(groups, user_entry, expected):
    c = parse_gpus_config(
        f"""\
{TWO_GPUS}pools: {{a: {{mode: exclusive}}, b: {{mode: shared, max_users: 2}}}}
groups:
  g1: {{max_gpus: 3, gpus: 1, pools: [a]}}
  g2: {{max_gpus: 2, pools: [b]}}
  deny: {{no_gpu: true}}
users:
  Alice: {user_entry or "{}"}
"""
    )
    assert policy_for(c, "alice", groups) == expected
    assert policy_for(c, "ALICE", groups) == expected  # usernames are not case-sensitive


@pytest.mark.parametrize(
    "text, where, words",
    [
        # YAML-level problems
        ("defaults:\n  gpus: 1\ndefaults:\n  gpus: 2\n", "gpus.yaml:3", "duplicate key 'defaults'"),
        ("users:\n  a: {max_gpus: 1, max_gpus: 2}\n", "gpus.yaml:2", "duplicate key 'max_gpus'"),
        ("pools: [\n", "gpus.yaml:2", "invalid YAML"),
        # unknown keys, with did-you-mean
        ("inventry: auto\n", "gpus.yaml:1: inventry", "did you mean inventory?"),
        ("defaults:\n  max_gpu: 2\n", "gpus.yaml:2: defaults.max_gpu", "did you mean max_gpus?"),
        ("users:\n  bob:\n    pined: [0]\n", "gpus.yaml:3: users.bob.pined",
         "did you mean pinned?"),
        ("pools:\n  a: {mode: shared, max_user: 2}\n", "gpus.yaml:2: pools.a.max_user",
         "did you mean max_users?"),
        (f"inventory:\n  - {{index: 0, uuid: {U0}, reservd: true}}\n",
         "gpus.yaml:2: inventory[0].reservd", "did you mean reserved?"),
        # wrong types
        ("inventory: all\n", "gpus.yaml:1: inventory", "expected `auto`"),
        ("inventory: {index: 0}\n", "gpus.yaml:1: inventory", "or a list of GPUs"),
        ("defaults:\n  gpus: one\n", "gpus.yaml:2: defaults.gpus", "whole number from 0 to 64"),
        ("defaults:\n  max_gpus: true\n", "gpus.yaml:2: defaults.max_gpus", "whole number"),
        ("defaults:\n  max_gpus: -1\n", "gpus.yaml:2: defaults.max_gpus", "whole number"),
        ("defaults:\n  max_gpus: 1000\n", "gpus.yaml:2: defaults.max_gpus", "0 to 64"),
        ("defaults:\n  gpus: 2\n  max_gpus: 1\n", "gpus.yaml:2: defaults.gpus",
         "more than defaults.max_gpus"),
        ("users:\n  bob:\n    no_gpu: yes please\n", "gpus.yaml:3: users.bob.no_gpu",
         "expected true or false"),
        ("users:\n  bob: 3\n", "gpus.yaml:2: users.bob", "expected a mapping"),
        ("defaults:\n  max_servers: 0\n", "gpus.yaml:2: defaults.max_servers",
         "from 1 (her default server only) to 100"),
        ("groups:\n  lab: {max_servers: two}\n", "gpus.yaml:2: groups.lab.max_servers",
         "a number of servers run at once"),
        ("users:\n  bob: {max_server: 3}\n", "gpus.yaml:2: users.bob.max_server",
         "did you mean max_servers?"),
        # a server's CPUs and memory
        ("defaults:\n  cpus: -2\n", "gpus.yaml:2: defaults.cpus", "number of CPUs above 0"),
        ("defaults:\n  cpus: four\n", "gpus.yaml:2: defaults.cpus", "number of CPUs"),
        ("defaults:\n  cpus: 4000\n", "gpus.yaml:2: defaults.cpus", "at most 1024"),
        ("groups:\n  lab:\n    memory: 16\n", "gpus.yaml:3: groups.lab.memory",
         "a size with its unit, such as 8g"),
        ("users:\n  bob:\n    memory_per_gpu: lots\n", "gpus.yaml:3: users.bob.memory_per_gpu",
         "a size such as 2g"),
        ("defaults:\n  cpus: 8\n  max_cpus: 4\n", "gpus.yaml:2: defaults.cpus",
         "cpus: 8 is more than max_cpus: 4 here"),
        ("defaults:\n  cpu: 8\n", "gpus.yaml:2: defaults.cpu", "did you mean cpus?"),
        ("groups: [staff]\n", "gpus.yaml:1: groups", "expected a mapping of group name"),
        ("pools:\n  a: {mode: sharing}\n", "gpus.yaml:2: pools.a.mode",
         "expected one of exclusive, shared"),
        # inventory entries
        ("inventory:\n  - {uuid: " + U0 + "}\n", "gpus.yaml:2: inventory[0]", "missing index"),
        ("inventory:\n  - {index: 0}\n", "gpus.yaml:2: inventory[0]", "missing uuid"),
        ("inventory:\n  - {index: 0, uuid: 0000-1111}\n", "gpus.yaml:2: inventory[0].uuid",
         "GPU UUID as `nvidia-smi -L` prints it"),
        ("inventory:\n  - {index: -1, uuid: " + U0 + "}\n", "gpus.yaml:2: inventory[0].index",
         "GPU's index"),
        (f"inventory:\n  - {{index: 0, uuid: {U0}}}\n  - {{index: 0, uuid: {U1}}}\n",
         "gpus.yaml:3: inventory[1].index", "index 0 is listed twice (first on line 2)"),
        (f"inventory:\n  - {{index: 0, uuid: {U0}}}\n  - {{index: 1, uuid: {U0}}}\n",
         "gpus.yaml:3: inventory[1].uuid", "listed twice (first on line 2)"),
        (f"inventory:\n  - {{index: 0, uuid: {U0}, reserved: 1}}\n",
         "gpus.yaml:2: inventory[0].reserved", "true or false"),
        # max_users
        ("pools:\n  a: {mode: shared, max_users: 0}\n", "gpus.yaml:2: pools.a.max_users",
         "from 1 to 1024"),
        ("pools:\n  a:\n    mode: shared\n    max_users: -3\n", "gpus.yaml:4: pools.a.max_users",
         "from 1 to 1024"),
        (f"inventory:\n  - {{index: 0, uuid: {U0}, mode: shared, max_users: 0}}\n",
         "gpus.yaml:2: inventory[0].max_users", "from 1 to 1024"),
        ("pools:\n  a:\n    mode: shared\n", "gpus.yaml:3: pools.a.mode", "needs max_users"),
        ("pools:\n  a: {max_users: 3}\n", "gpus.yaml:2: pools.a.max_users", "needs mode: shared"),
        (f"inventory:\n  - index: 0\n    uuid: {U0}\n    max_users: 2\n",
         "gpus.yaml:4: inventory[0].max_users", "needs mode: shared"),
        (f"inventory:\n  - index: 0\n    uuid: {U0}\n    mode: shared\n",
         "gpus.yaml:4: inventory[0].mode", "needs max_users"),
        # unknown pool
        (f"inventory:\n  - {{index: 0, uuid: {U0}, pool: a10}}\npools:\n  a100: {{}}\n",
         "gpus.yaml:2: inventory[0].pool", "unknown pool 'a10'; did you mean a100?"),
        ("defaults:\n  pools: [big]\n", "gpus.yaml:2: defaults.pools[0]",
         "unknown pool 'big'; pools declared under pools: default"),
        ("pools:\n  small: {}\ngroups:\n  s:\n    pools: [smal]\n",
         "gpus.yaml:5: groups.s.pools[0]",
         "did you mean small?"),
        ("pools:\n  'bad name': {}\n", "gpus.yaml:2: pools.bad name", "pool name made of"),
        # pins
        (f"{TWO_GPUS}users:\n  bob:\n    pinned: [{U0}, GPU-deadbeef]\n",
         "gpus.yaml:6: users.bob.pinned[1]",
         f"pinned GPU 'GPU-deadbeef' is not listed under inventory; GPUs listed there: "
         f"0 ({U0}), 1 ({U1})"),
        (f"{TWO_GPUS}groups:\n  g:\n    pinned:\n      - 0\n      - 7\n",
         "gpus.yaml:8: groups.g.pinned[1]", "pinned GPU 7 is not listed under inventory"),
        (f"{TWO_GPUS}users:\n  bob: {{pinned: [0, 0]}}\n", "gpus.yaml:5: users.bob.pinned[1]",
         "pinned twice"),
        ("users:\n  bob: {pinned: [1.5]}\n", "gpus.yaml:2: users.bob.pinned[0]", "GPU's index"),
        ("users:\n  bob: {pinned: {a: 1}}\n", "gpus.yaml:2: users.bob.pinned",
         "list of GPU UUIDs or indexes"),
        (f"{TWO_GPUS}users:\n  bob:\n    pinned: [0, 1]\n    max_gpus: 1\n",
         "gpus.yaml:7: users.bob.max_gpus", "less than the 2 pinned GPUs"),
        # contradictions inside one entry
        ("users:\n  bob:\n    no_gpu: true\n    max_gpus: 2\n", "gpus.yaml:3: users.bob.no_gpu",
         "cannot be combined"),
        ("groups:\n  g: {gpus: 3, max_gpus: 2}\n", "gpus.yaml:2: groups.g.gpus",
         "more than max_gpus: 2"),
        ("users:\n  Bob: {}\n  bob: {}\n", "gpus.yaml:3: users.bob",
         "listed twice (first on line 2"),
        # culling
        ("defaults:\n  gpu_idle_timeout: soon\n", "gpus.yaml:2: defaults.gpu_idle_timeout",
         "expected a duration such as 90s, 15m, 2h or 1d, got 'soon' (0 means never)"),
        ("groups:\n  g: {max_server_age: -1d}\n", "gpus.yaml:2: groups.g.max_server_age",
         "expected a duration"),
        ("culling:\n  idle_below: 150\n", "gpus.yaml:2: culling.idle_below",
         "above 0 and under 100 (for example 5 or 5%), got 150"),
        ("culling:\n  idle_below: 'five%'\n", "gpus.yaml:2: culling.idle_below",
         "percentage"),
        ("culling:\n  check_every: 0\n", "gpus.yaml:2: culling.check_every",
         "above 0"),
        ("culling:\n  warn_befor: 5m\n", "gpus.yaml:2: culling.warn_befor",
         "did you mean warn_before?"),
    ],
)
def test_bad_config_names_file_line_and_field(text, where, words):
    with pytest.raises(ConfigError) as e:
        parse_gpus_config(text, "gpus.yaml")
    assert str(e.value).startswith(where), str(e.value)
    assert words in str(e.value), str(e.value)


def test_error_from_a_real_file_names_its_path(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text("defaults:\n  gpus: 1\n  max_gpus: 1\n  pools: [nope]\n")
    with pytest.raises(ConfigError) as e:
        load_gpus_config(path)
    assert str(e.value).startswith(f"{path}:4: defaults.pools[0]: unknown pool 'nope'")
    assert e.value.line == 4 and e.value.filename == str(path)


def test_pins_by_index_are_allowed_with_auto_inventory():
    # Auto inventory is only known at runtime: pins are checked against it then
    # (allocator.resolve_inventory warns about pins that match no GPU).
    c = parse_gpus_config("users:\n  bob: {pinned: [3, " + U1 + "]}\n")
    assert policy_for(c, "bob").pinned == (Pin(3, 2), Pin(U1, 2))
    assert all_pins(c) == (Pin(3, 2), Pin(U1, 2))


@pytest.mark.parametrize("groups, user_entry, expected", [
    ([], "", (7200, 0)),                                  # the defaults
    (["short"], "", (1800, 0)),                           # a group's own value replaces them
    (["short", "long"], "", (8 * 3600, 86400)),           # the longest of the groups
    (["short", "never"], "", (0, 0)),                     # 0 = never is the longest
    (["long"], "{gpu_idle_timeout: 10m}", (600, 86400)),  # the user's own value wins
    (["never"], "{max_server_age: 2d}", (0, 2 * 86400)),
])
def test_culling_limits_precedence(groups, user_entry, expected):
    text = """
culling: {idle_below: 10, warn_before: 5m, check_every: 30s}
groups:
  short: {gpu_idle_timeout: 30m}
  long: {gpu_idle_timeout: 8h, max_server_age: 1d}
  never: {gpu_idle_timeout: 0}
""" + (f"users:\n  zoe: {user_entry}\n" if user_entry else "")
    c = parse_gpus_config(text)
    p = policy_for(c, "zoe", groups)
    assert (p.gpu_idle_timeout, p.max_server_age) == expected
    assert (c.culling.idle_below, c.culling.warn_before, c.culling.check_every) == (0.1, 300, 30)


@pytest.mark.parametrize("groups, user_entry, expected", [
    ([], "", 2),                       # gpulab's default
    (["one"], "", 1),                  # a group's own value replaces it
    (["one", "many"], "", 5),          # the most of her groups
    (["many"], "{max_servers: 1}", 1),  # her own value wins
])
def test_max_servers_precedence(groups, user_entry, expected):
    text = "groups:\n  one: {max_servers: 1}\n  many: {max_servers: 5}\n" + (
        f"users:\n  zoe: {user_entry}\n" if user_entry else "")
    assert policy_for(parse_gpus_config(text), "zoe", groups).max_servers == expected
    assert policy_for(parse_gpus_config("defaults: {max_servers: 4}\n"), "z").max_servers == 4


def test_culling_defaults_and_the_shipped_file():
    c = parse_gpus_config("")
    assert (c.default_gpu_idle_timeout, c.default_max_server_age) == (7200, 0)
    assert (c.culling.idle_below, c.culling.warn_before, c.culling.check_every) == (0.05, 900, 60)
    shipped = load_gpus_config(EXAMPLE)
    assert shipped.culling == c.culling and shipped.default_gpu_idle_timeout == 7200
    assert policy_for(parse_gpus_config("users:\n  v: {no_gpu: true}\n"), "v").no_gpu


@pytest.mark.parametrize("text, where, words", [
    ("pools:\n  a: {machines: [gpu-1]}\n  b: {machines: [gpu-2, gpu-1]}\n",
     "gpus.yaml:3: pools.b.machines[1]", "machine gpu-1 is in pool a already"),
    ("inventory:\n  - {index: 0, uuid: GPU-1}\npools:\n  a: {machines: [gpu-1]}\n",
     "gpus.yaml:4: pools.a.machines", "an explicit inventory gives each GPU its pool"),
    ("pools:\n  a: {machines: gpu-1}\n", "gpus.yaml:2: pools.a.machines", "expected a list"),
    ("pools:\n  a: {machines: ['gpu 1']}\n", "gpus.yaml:2: pools.a.machines[0]",
     "a machine's hostname"),
    ("users:\n  bob: {pinned: ['gpu-1:0', 'gpu-1:0']}\n", "gpus.yaml:2: users.bob.pinned[1]",
     "'gpu-1:0' is pinned twice"),
    ("users:\n  bob: {pinned: ['gpu-1:1000']}\n", "gpus.yaml:2: users.bob.pinned[0]",
     "expected MACHINE:INDEX"),
])
def test_machines_in_pools_and_pins_are_checked(text, where, words):
    with pytest.raises(ConfigError) as e:
        parse_gpus_config(text)
    assert str(e.value).startswith(where) and words in str(e.value), str(e.value)


@pytest.mark.parametrize("pin, gpu, names_it", [
    (Pin(U0), (3, U0, ""), True),               # a UUID names its GPU wherever it is
    (Pin(U0), (3, U0, "gpu-server-2"), True),
    (Pin(U0), (0, U1, ""), False),
    (Pin(0), (0, U1, ""), True),                # an index names a GPU of one host
    (Pin(0), (0, U1, "gpu-server-2"), False),   # ... not of a machine of a Swarm
    (Pin(0, machine="gpu-server-2"), (0, U1, "gpu-server-2"), True),  # MACHINE:INDEX
    (Pin(0, machine="gpu-server-2"), (0, U1, "gpu-server-1"), False),
    (Pin(0, machine="gpu-server-2"), (1, U1, "gpu-server-2"), False),
])
def test_which_gpu_a_pin_names(pin, gpu, names_it):
    assert pin_matches(pin, *gpu) is names_it


RESOURCES = """\
defaults: {max_gpus: 4, cpus: 2, memory: 8g, cpus_per_gpu: 4, memory_per_gpu: 32g,
           max_cpus: 12, max_memory: 96g}
groups:
  vision: {cpus_per_gpu: 6}
  theory: {cpus_per_gpu: 2, memory: 4g}
users:
  ann: {memory: 16g, max_cpus: 32}
"""


@pytest.mark.parametrize("user,groups,gpus,cpus,gib", [
    ("bob", [], 0, 2, 8),
    ("bob", [], 1, 6, 40),
    ("bob", [], 4, 12, 96),  # 18 CPUs and 136 GB asked: the caps
    ("cat", ["vision"], 1, 8, 40),
    ("cat", ["vision", "theory"], 1, 8, 36),  # groups: the most each sets, over defaults
    ("ann", ["vision"], 4, 26, 96),  # her own entry: hers, key by key
])
def test_cpus_and_memory_follow_the_gpus_within_the_caps(user, groups, gpus, cpus, gib):
    from gpulab.gpus.policy import server_resources

    got = server_resources(policy_for(parse_gpus_config(RESOURCES), user, groups), gpus,
                           base_cpus=4.0, base_memory=8 << 30)
    assert (got.cpus, got.memory) == (cpus, gib << 30)


def test_unset_the_labs_spawn_limits_hold_and_the_form_says_what_a_server_gets():
    from gpulab.gpus.policy import resources_note, server_resources

    plain = policy_for(parse_gpus_config(""), "bob")
    got = server_resources(plain, 2, base_cpus=4.0, base_memory=8 << 30)
    assert (got.cpus, got.memory, got.threads) == (4.0, 8 << 30, 4)
    assert resources_note(plain, 4.0, 8 << 30) == "A server gets 4 CPUs and 8 GB of memory."
    sized = policy_for(parse_gpus_config(RESOURCES), "bob")
    assert resources_note(sized, 4.0, 8 << 30) == (
        "A server gets 2 CPUs and 8 GB of memory, and 4 CPUs and 32 GB of memory more for "
        "each GPU (at most 12 CPUs and 96 GB).")


PROJECTS = """\
groups:
  vision: {projects: [cars, faces]}
  theory: {projects: [faces, proofs], max_gpus: 1}
"""


def test_a_groups_projects_are_her_servers_folders_from_all_her_groups():
    config = parse_gpus_config(PROJECTS)
    assert policy_for(config, "ann", ["vision", "theory"]).projects == ("cars", "faces",
                                                                          "proofs")
    assert policy_for(config, "bob", ["theory"]).projects == ("faces", "proofs")
    assert policy_for(config, "cy", ["other"]).projects == ()


@pytest.mark.parametrize("text, where, says", [
    ("users:\n  ann: {projects: [x]}\n", "gpus.yaml:2: users.ann.projects",
     "projects are a group's"),
    ("groups:\n  g: {projects: [Cars]}\n", "gpus.yaml:2: groups.g.projects",
     "lower-case letters, digits and '-'"),
    ("groups:\n  g: {projects: []}\n", "gpus.yaml:2: groups.g.projects", "a list of project"),
    ("groups:\n  g: {projects: vision}\n", "gpus.yaml:2: groups.g.projects",
     "a list of project"),
    ("groups:\n  g: {projects: [" + ", ".join(f"p{i}" for i in range(10)) + "]}\n"
     "  h: {projects: [" + ", ".join(f"q{i}" for i in range(7)) + "]}\n",
     "gpus.yaml:3: groups.h.projects", "the groups name 17 projects; the lab has at most 16"),
])
def test_bad_projects_are_refused_at_their_line(text, where, says):
    with pytest.raises(ConfigError) as e:
        parse_gpus_config(text)
    assert str(e.value).startswith(where) and says in str(e.value), str(e.value)
