"""What the Docker proxy lets through: the policy, as pure functions (no I/O).

Whoever can create containers through the Docker API is root on the host, so the hub's
only way to Docker (:mod:`gpulab.docker_proxy`) lets through exactly the calls the hub
makes, and a container create only when it describes a hardened gpulab user container.

The policy decides on exactly what dockerd will act on. dockerd decodes a create body
with Go's ``encoding/json``, which merges duplicated objects, matches field names
case-insensitively (with Unicode folding: ``ſ`` matches ``s``, ``K`` matches ``k``),
ignores unknown keys, and reads a deprecated HostConfig at the top level of the body.
So :func:`decide` refuses (and says why):

* a body that is not strict JSON: a duplicate key at any depth, NaN or Infinity, a lone
  surrogate, anything but UTF-8, anything but an object;
* every key that is not on the allow-list below by its exact spelling, whatever its
  value (``null``, ``false`` and ``[]`` included), at every level; free-form maps only
  where Docker's type is a map (Labels, ExposedPorts, Volumes, EndpointsConfig);
* values of the wrong JSON type (``true`` is not a number, ``1.0`` not an integer);
* a create that is not a hardened user container of this lab: root (``User`` must be a
  numeric non-root ``uid[:gid]``), capabilities not all dropped, anything but
  ``no-new-privileges`` as security option, privileged mode, host namespaces, devices,
  runtimes, sysctls, published ports, host paths (only named volumes may be mounted,
  not gpulab's own volumes, and the datasets volume read-only), links, endpoint settings
  that could take the hub's address or name (aliases, IPs, MAC), missing memory or
  process limits, another image than ``spawn.image``, another network than
  ``spawn.network``, a name without :data:`~gpulab.contract.USER_CONTAINER_PREFIX`, GPUs
  requested by count (``-1`` is all of them) instead of by UUID, GPUs that differ from
  the container's lease label, or ``NVIDIA_VISIBLE_DEVICES`` other than the leased
  UUIDs (``void`` for none: images set ``all``, which the NVIDIA runtime honours);
* query parameters that are not on the route's allow-list, and request bodies outside
  a create.

What is forwarded is the checked object re-serialized (:attr:`Decision.body`), never the
client's bytes, so dockerd acts on what was checked. A per-container call is allowed
here only provisionally: the proxy resolves :attr:`Decision.container` to a full ID,
checks that container's managed label and forwards :meth:`Decision.target` with that ID.

With ``swarm=True`` (the proxy in front of a Swarm manager) the service, task and node
calls of :mod:`gpulab.swarm_policy` are allowed too, and a per-service call (or a task
list, which names one service) is provisional in the same way: :attr:`Decision.service`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

from .contract import INFRA_VOLUMES, LABEL_GPUS, LABEL_MANAGED, LABEL_USER, USER_CONTAINER_PREFIX
from .settings import defaults

# API versions below 1.24 let a start request carry a HostConfig that replaces the
# checked one; DeviceRequests need 1.40. Older clients are refused.
MIN_API_VERSION = (1, 40)
INT64_MAX = 2**63 - 1

NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"  # Docker's container, volume and network names
_REF = re.compile(NAME)
_VERSION = re.compile(r"/v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(?=/)")
_USER = re.compile(r"[1-9][0-9]{0,9}(:[1-9][0-9]{0,9})?")
# As nvidia-smi -L prints them; gpus.yaml also accepts MIG devices' UUIDs.
_GPU_UUID = re.compile(r"(GPU|MIG)-[0-9A-Fa-f]+(-[0-9A-Fa-f]+)*")
_BIND = re.compile(rf"({NAME}):(/[^:]*)(?::(ro|rw))?")
_PORT = re.compile(r"[1-9][0-9]{0,4}/(tcp|udp|sctp)")
_SIGNAL = re.compile(r"[A-Za-z0-9+]{1,16}")
_IMAGE = re.compile(r"[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?(@sha256:[0-9a-f]{64})?")
NO_NEW_PRIVILEGES = ("no-new-privileges", "no-new-privileges:true", "no-new-privileges=true")
# With the NVIDIA toolkit's volume-mount strategy a mount here selects GPUs.
_GPU_SELECTING_PATHS = ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices")


class BodyError(ValueError):
    """The body is not strict JSON (dockerd might read it differently than we do)."""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reasons: tuple[str, ...] = ()
    status: int = 403  # for a refusal: 400 unreadable body, 403 policy
    path: str = ""  # to forward; in a per-container call "{id}" stands for the full ID
    query: str = ""  # the checked query parameters, re-encoded
    body: bytes = b""  # a create's checked body, re-serialized
    container: str = ""  # a per-container call: the reference to resolve to a full ID
    service: str = ""  # a per-service call or a task list: the service to resolve

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    def target(self, object_id: str = "") -> str:
        """The request target to forward, with *object_id* (the resolved container or
        service) in a per-object path or a task list's filter."""
        from .swarm_policy import ID_SLOT
        path, query = self.path, self.query
        if self.container or self.service:
            path = path.replace("{id}", object_id)
        if self.service:
            query = query.replace(ID_SLOT, object_id)
        return f"{path}?{query}" if query else path


def _refused(*reasons: str, status: int = 403) -> Decision:
    return Decision(False, tuple(reasons), status=status)


# ---------------------------------------------------------------- strict JSON


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BodyError(f"duplicate key {key!r} (dockerd would merge or override them)")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise BodyError(f"{name} is not a JSON number")


def _valid_strings(value: Any) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BodyError(f"string {value!r} holds a lone surrogate") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _valid_strings(k)
            _valid_strings(v)
    elif isinstance(value, list):
        for v in value:
            _valid_strings(v)


def strict_json(body: bytes) -> Any:
    """Parse *body* as strict JSON or raise :class:`BodyError` saying why."""
    try:
        value = json.loads(body.decode("utf-8"), object_pairs_hook=_no_duplicates,
                           parse_constant=_no_constant)
    except BodyError:
        raise
    except RecursionError:
        raise BodyError("nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise BodyError(f"not valid JSON: {e}") from None
    _valid_strings(value)
    return value


# ---------------------------------------------------------------- value checks
# A check takes (value, where) and returns the reasons it refuses the value ([] = fine).

Check = Callable[[Any, str], list[str]]


def _json_type(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object", type(None): "null"}.get(type(value), "?")


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def obj(fields: Mapping[str, Check], required: Iterable[str] = (),
        unknown: str = "gpulab's containers never need it") -> Check:
    """A JSON object whose keys are exactly (by spelling) among *fields*; *unknown* says
    why any other key is refused."""
    required = tuple(required)

    def check(value: Any, where: str) -> list[str]:
        if not isinstance(value, dict):
            return [f"{where or 'body'}: expected an object, got {_json_type(value)}"]
        reasons = []
        for key, item in value.items():
            if key in fields:
                reasons += fields[key](item, _at(where, key))
                continue
            near = [k for k in fields if k.casefold() == key.casefold()]
            hint = (f"keys are matched exactly; did you mean {near[0]!r}?" if near
                    else unknown)
            reasons.append(f"{where or 'body'}: key {key!r} is not allowed ({hint})")
        reasons += [f"{where or 'body'}: {key!r} is required" for key in required
                    if key not in value]
        return reasons

    check.fields = fields  # for the tests and the docs
    return check


def mapping(key: re.Pattern, key_means: str, value: Check) -> Check:
    """A free-form map (Docker's type is a map): keys matching *key*, values *value*."""
    def check(v: Any, where: str) -> list[str]:
        if not isinstance(v, dict):
            return [f"{where}: expected an object, got {_json_type(v)}"]
        reasons = []
        for k, item in v.items():
            if not key.fullmatch(k):
                reasons.append(f"{where}: key {k!r} is not {key_means}")
            reasons += value(item, f"{where}[{k!r}]")
        return reasons
    return check


def array(item: Check, min_items: int = 0, max_items: int = 1000) -> Check:
    def check(v: Any, where: str) -> list[str]:
        if not isinstance(v, list):
            return [f"{where}: expected a list, got {_json_type(v)}"]
        if not min_items <= len(v) <= max_items:
            return [f"{where}: expected {min_items} to {max_items} items, got {len(v)}"]
        return [r for i, x in enumerate(v) for r in item(x, f"{where}[{i}]")]
    return check


def text(pattern: re.Pattern | None = None, means: str = "", max_len: int = 65536) -> Check:
    def check(v: Any, where: str) -> list[str]:
        if not isinstance(v, str):
            return [f"{where}: expected a string, got {_json_type(v)}"]
        if len(v) > max_len or (pattern is not None and not pattern.fullmatch(v)):
            return [f"{where}: {v[:200]!r} is not {means}"]
        return []
    return check


def integer(minimum: int, maximum: int = INT64_MAX) -> Check:
    def check(v: Any, where: str) -> list[str]:
        if type(v) is not int:
            return [f"{where}: expected an integer, got {_json_type(v)}"]
        if not minimum <= v <= maximum:
            return [f"{where}: {v} is out of range ({minimum} to {maximum})"]
        return []
    return check


def boolean(v: Any, where: str) -> list[str]:
    return [] if type(v) is bool else [f"{where}: expected a boolean, got {_json_type(v)}"]


def _canonical(v: Any) -> str:
    return json.dumps(v, sort_keys=True)


def exactly(*choices: Any, why: str = "") -> Check:
    """One of *choices*, compared as JSON (so ``false`` is not ``0``)."""
    allowed = {_canonical(c) for c in choices}
    expected = " or ".join(_canonical(c) for c in choices)

    def check(v: Any, where: str) -> list[str]:
        if _canonical(v) in allowed:
            return []
        return [f"{where}: {why + ': ' if why else ''}must be {expected}, "
                f"got {_canonical(v)[:200]}"]
    return check


def either(*checks: Check) -> Check:
    def check(v: Any, where: str) -> list[str]:
        results = [c(v, where) for c in checks]
        return [] if any(not r for r in results) else results[-1]
    return check


def abs_path(v: Any, where: str) -> list[str]:
    if not isinstance(v, str):
        return [f"{where}: expected a path, got {_json_type(v)}"]
    parts = v.split("/")
    if (not v.startswith("/") or v == "/" or ":" in v or "\x00" in v or len(v) > 4096
            or any(p in (".", "..") for p in parts)):
        return [f"{where}: {v[:200]!r} is not an absolute path inside the container"]
    if any(v == p or v.startswith(p + "/") for p in _GPU_SELECTING_PATHS):
        return [f"{where}: {v!r} would select GPUs through the NVIDIA runtime"]
    return []


def user(v: Any, where: str) -> list[str]:
    if isinstance(v, str) and _USER.fullmatch(v) and all(
            int(x) < 2**31 for x in v.split(":")):
        return []
    return [f"{where}: containers must run as a numeric non-root user uid[:gid] (not 0, "
            f"no leading zeros), got {v!r}"]


def bind(v: Any, where: str) -> list[str]:
    m = _BIND.fullmatch(v) if isinstance(v, str) else None
    if not m:
        return [f"{where}: {v!r} is not a named volume 'name:/path[:ro|:rw]' (host paths "
                f"and other options are not allowed)"]
    return abs_path(m.group(2), where)


# ---------------------------------------------------------------- the allow-list

_COUNT = integer(0)
_SIZE = integer(1)
_STRINGS = array(text())

# NetworkingConfig.EndpointsConfig[network]: none of the endpoint settings is needed,
# and Aliases, IPAddress, IPAMConfig, MacAddress or Links could take the hub's identity.
ENDPOINT_SETTINGS = obj({}, unknown="it could take the hub's name or address")
NETWORKING_CONFIG = obj({
    "EndpointsConfig": mapping(_REF, "a network name", ENDPOINT_SETTINGS),
})
DEVICE_REQUEST = obj({
    "Driver": exactly("nvidia"),
    # -1 is every GPU, a positive count any GPUs: GPUs are named (DeviceIDs).
    "Count": exactly(0, why="GPU requests name their devices (DeviceIDs), not a count"),
    "DeviceIDs": array(text(_GPU_UUID, "a GPU UUID (GPU-... or MIG-...)"), min_items=1),
    "Capabilities": exactly([["gpu"]]),
    "Options": exactly({}),
}, required=("Driver", "DeviceIDs", "Capabilities"))
MOUNT = obj({
    "Type": exactly("volume"),
    "Source": text(_REF, "a volume name"),
    "Target": abs_path,
    "ReadOnly": boolean,
}, required=("Type", "Source", "Target"))
HEALTHCHECK = obj({
    "Test": _STRINGS, "Interval": _COUNT, "Timeout": _COUNT, "StartPeriod": _COUNT,
    "Retries": _COUNT,
})
HOST_CONFIG = obj({
    "Binds": array(bind),
    "Mounts": array(MOUNT),
    "Links": exactly([], why="links are not allowed"),
    "CapDrop": exactly(["ALL"], why="containers must drop all capabilities"),
    "SecurityOpt": exactly(*([s] for s in NO_NEW_PRIVILEGES),
                           why="containers run with no-new-privileges and no other security "
                               "option"),
    "NetworkMode": text(_REF, "a network name"),  # == spawn.network, below
    "Memory": _SIZE,
    "MemorySwap": _SIZE,  # >= Memory, below
    "ShmSize": _SIZE,
    "PidsLimit": _SIZE,
    "CpuQuota": _COUNT,
    "CpuPeriod": _COUNT,
    "NanoCpus": _COUNT,
    "Init": boolean,
    "AutoRemove": boolean,
    "DeviceRequests": array(DEVICE_REQUEST, max_items=1),
}, required=("CapDrop", "SecurityOpt", "NetworkMode", "Memory", "PidsLimit"))
# The top level is container.Config; dockerd also reads a deprecated HostConfig there,
# so no HostConfig key may appear at the top level.
CREATE_BODY = obj({
    "Image": text(_IMAGE, "an image name"),  # == spawn.image, below
    "User": user,
    "Cmd": _STRINGS,
    "Entrypoint": _STRINGS,
    "WorkingDir": either(exactly(""), abs_path),
    "Env": array(text(re.compile(r"[^=\x00]+=[^\x00]*", re.S), "KEY=VALUE")),
    "Labels": mapping(re.compile(r".+", re.S), "a label name", text()),
    "ExposedPorts": mapping(_PORT, "a port such as 8888/tcp", exactly(None, {})),
    "Volumes": mapping(re.compile(r"/.*", re.S), "an absolute path", exactly(None, {})),
    "Tty": boolean, "OpenStdin": boolean, "StdinOnce": boolean, "AttachStdin": boolean,
    "AttachStdout": boolean, "AttachStderr": boolean, "NetworkDisabled": boolean,
    "StopSignal": text(_SIGNAL, "a signal"),
    "StopTimeout": _COUNT,
    "Healthcheck": HEALTHCHECK,
    "HostConfig": HOST_CONFIG,
    "NetworkingConfig": NETWORKING_CONFIG,
}, required=("Image", "User", "Env", "Labels", "HostConfig"))


def normal_image(ref: str) -> str:
    """``gpulab/singleuser`` -> ``gpulab/singleuser:latest``; ``docker.io/library/x`` -> ``x``."""
    name, at, digest = ref.partition("@")
    for prefix in ("docker.io/", "library/"):
        name = name.removeprefix(prefix)
    if not at and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name + at + digest


def _create_rules(spec: dict[str, Any], name: str | None, settings: Mapping[str, Any]
                  ) -> list[str]:
    """What the allow-list cannot say alone: the lab's settings and the lease. *spec*
    has passed :data:`CREATE_BODY`."""
    reasons = []
    hc = spec["HostConfig"]
    if name is None or not name.startswith(USER_CONTAINER_PREFIX) or not re.fullmatch(
            r"[A-Za-z0-9][A-Za-z0-9_.-]+", name) or name == USER_CONTAINER_PREFIX:
        reasons.append(f"name: user containers are named {USER_CONTAINER_PREFIX}<user> "
                       f"(a valid Docker name), got {name!r}")
    image = settings["spawn.image"]
    if normal_image(spec["Image"]) != normal_image(image):
        reasons.append(f"Image: only the lab's image {image} (spawn.image) may be run, "
                       f"got {spec['Image']!r}")
    network = settings["spawn.network"]
    if hc["NetworkMode"] != network:
        reasons.append(f"HostConfig.NetworkMode: only the users' network {network} "
                       f"(spawn.network), got {hc['NetworkMode']!r}")
    endpoints = (spec.get("NetworkingConfig") or {}).get("EndpointsConfig") or {}
    reasons += [f"NetworkingConfig.EndpointsConfig: only the users' network {network}, "
                f"got {other!r}" for other in endpoints if other != network]
    if "MemorySwap" in hc and hc["MemorySwap"] < hc["Memory"]:
        reasons.append("HostConfig.MemorySwap: must be at least Memory")

    datasets = settings["spawn.datasets_volume"]
    volumes = [(m.group(1), m.group(3) == "ro") for m in map(_BIND.fullmatch, hc.get("Binds", []))]
    volumes += [(m["Source"], m.get("ReadOnly") is True) for m in hc.get("Mounts", [])]
    for volume, read_only in volumes:
        if volume in INFRA_VOLUMES and volume != datasets:
            reasons.append(f"HostConfig: volume {volume} is gpulab's own")
        elif volume == datasets and not read_only:
            reasons.append(f"HostConfig: the datasets volume {volume} is mounted read-only")
    reasons += [r for path in spec.get("Volumes", {}) for r in abs_path(path, "Volumes")]

    labels = spec["Labels"]
    if labels.get(LABEL_MANAGED) != "true":
        reasons.append(f"Labels: {LABEL_MANAGED} must be 'true'")
    if not labels.get(LABEL_USER):
        reasons.append(f"Labels: {LABEL_USER} must name the user")
    if LABEL_GPUS not in labels:
        reasons.append(f"Labels: {LABEL_GPUS} is required ('' for no GPU)")
        return reasons
    leased = labels[LABEL_GPUS].split(",") if labels[LABEL_GPUS] else []
    if any(not _GPU_UUID.fullmatch(u) for u in leased) or len(set(leased)) != len(leased):
        reasons.append(f"Labels: {LABEL_GPUS} must be distinct GPU UUIDs joined by ',', got "
                       f"{labels[LABEL_GPUS]!r}")
    requested = [u for r in hc.get("DeviceRequests", []) for u in r["DeviceIDs"]]
    if sorted(requested) != sorted(set(leased)):
        reasons.append(f"HostConfig.DeviceRequests: the GPUs requested {requested} must be "
                       f"exactly the leased ones in the {LABEL_GPUS} label {leased}")

    env = [e.split("=", 1) for e in spec["Env"]]
    visible = [v for k, v in env if k == "NVIDIA_VISIBLE_DEVICES"]
    want = ",".join(leased) or "void"
    if visible != [want]:
        reasons.append(f"Env: NVIDIA_VISIBLE_DEVICES must be set once, to {want!r} (the "
                       f"leased GPUs), got {visible}")
    reasons += [f"Env: {k} is not allowed (only NVIDIA_VISIBLE_DEVICES of the NVIDIA "
                f"runtime's settings)" for k, _ in env
                if k.startswith("NVIDIA_") and k != "NVIDIA_VISIBLE_DEVICES"]
    return reasons


# ---------------------------------------------------------------- routes

_BOOL = re.compile(r"(?i)0|1|true|false")
_FALSE = re.compile(r"(?i)0|false")
_INTEGER = re.compile(r"-?[0-9]{1,10}")
_TIME = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")
_ANY = re.compile(r".{0,4096}", re.S)


@dataclass(frozen=True)
class Route:
    method: str
    template: str  # /containers/{ref}/stop
    path: re.Pattern  # a per-container path names its container in the group "ref"
    params: Mapping[str, re.Pattern]  # allowed query parameters -> their values
    read_only: bool = False  # also open to read-only clients (the exporter)
    swarm: bool = False  # only in front of a Swarm manager (gpulab.swarm_policy)


def _route(method: str, path: str, read_only: bool = False, swarm: bool = False,
           **params: re.Pattern) -> Route:
    pattern = path
    for group in ("ref", "service", "node"):  # container, service, node references
        pattern = pattern.replace(f"{{{group}}}", f"(?P<{group}>{NAME})")
    return Route(method, path, re.compile(pattern), params, read_only, swarm)


_IMAGE_PATH = rf"{NAME}(/{NAME})*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?"
ROUTES: tuple[Route, ...] = (
    _route("GET", "/_ping", read_only=True),
    _route("HEAD", "/_ping", read_only=True),
    _route("GET", "/version", read_only=True),
    _route("GET", "/containers/json", read_only=True, all=_BOOL, filters=_ANY,
           limit=_INTEGER, size=_BOOL, trunc_cmd=_BOOL, since=_REF, before=_REF),
    _route("POST", "/containers/create", name=_ANY),  # the name is checked with the body
    _route("GET", "/containers/{ref}/json"),
    _route("GET", "/containers/{ref}/logs", stdout=_BOOL, stderr=_BOOL, timestamps=_BOOL,
           follow=_FALSE, tail=re.compile("all|[0-9]{1,9}"), since=_TIME, until=_TIME),
    _route("POST", "/containers/{ref}/start"),
    _route("POST", "/containers/{ref}/stop", t=_INTEGER, signal=_SIGNAL),
    _route("POST", "/containers/{ref}/kill", signal=_SIGNAL),
    _route("DELETE", "/containers/{ref}", v=_BOOL, force=_BOOL, link=_FALSE),
    _route("GET", f"/images/{_IMAGE_PATH}/json"),
    _route("GET", f"/volumes/{NAME}"),
    # A Swarm manager: what a SwarmSpawner-style spawner calls (docker-py's create_service,
    # inspect_service, services, remove_service, tasks) and the nodes the hub places
    # servers on (their GPUs are in each node's engine label). No updates of services or
    # nodes, no secrets, configs, swarm init/join/leave, plugins, service or task logs.
    _route("POST", "/services/create", swarm=True),
    _route("GET", "/services", swarm=True, filters=_ANY, status=_BOOL),
    _route("GET", "/services/{service}", swarm=True, insertDefaults=_BOOL),
    _route("DELETE", "/services/{service}", swarm=True),
    _route("GET", "/tasks", swarm=True, filters=_ANY),
    _route("GET", "/nodes", swarm=True, filters=_ANY),
    _route("GET", "/nodes/{node}", swarm=True),
)


def _split_version(raw_path: str) -> tuple[str, str]:
    """'/v1.41/containers/json' -> ('/v1.41', '/containers/json')."""
    version = _VERSION.match(raw_path)
    prefix = version.group(0) if version else ""
    return prefix, raw_path[len(prefix):]


def is_create(method: str, target: str) -> bool:
    """Will :func:`decide` need the lab's settings for this call (a container or service
    create)?"""
    return method == "POST" and _split_version(target.split("?", 1)[0])[1] in (
        "/containers/create", "/services/create")


def decide(method: str, target: str, body: bytes = b"", *,
           settings: Mapping[str, Any] | None = None, read_only: bool = False,
           swarm: bool = False) -> Decision:
    """May the hub make this Docker API call (method, request target, body)?

    *settings* are the lab's (``spawn.image``, ``spawn.network``,
    ``spawn.datasets_volume``; default :func:`gpulab.settings.defaults`); *read_only*
    allows only ping, version and the container list (the exporter's proxy); *swarm*
    adds the service, task and node calls (the proxy in front of a Swarm manager).
    """
    from . import swarm_policy

    if "#" in target or not target.startswith("/"):
        return _refused(f"request target {target[:200]!r} is not a plain path", status=400)
    raw_path, _, raw_query = target.partition("?")
    prefix, path = _split_version(raw_path)
    if prefix and tuple(map(int, prefix[2:].split("."))) < MIN_API_VERSION:
        return _refused(f"Docker API versions below "
                        f"{'.'.join(map(str, MIN_API_VERSION))} are refused")
    routes = [r for r in ROUTES if (r.read_only or not read_only) and (swarm or not r.swarm)]
    match = next(((r, m) for r in routes if r.method == method
                  for m in [r.path.fullmatch(path)] if m), None)
    if match is None:
        who = "a read-only client" if read_only else "the hub"
        return _refused(f"{method} {path[:200]} is not among the calls {who} needs")
    route, m = match
    if route.swarm and prefix and tuple(map(int, prefix[2:].split("."))) < (
            swarm_policy.MIN_API_VERSION):
        return _refused(f"Swarm calls need Docker API version "
                        f"{'.'.join(map(str, swarm_policy.MIN_API_VERSION))} or later (older "
                        f"versions drop CapabilityDrop and the pids limit from service specs)")

    try:
        params = parse_qsl(raw_query, keep_blank_values=True, strict_parsing=True,
                           errors="strict")
    except (ValueError, UnicodeDecodeError) as e:
        return _refused(f"query string: {e}", status=400)
    names = [k for k, _ in params]
    reasons = [f"query parameter {k!r} is given twice" for k in sorted(set(names))
               if names.count(k) > 1]
    reasons += [f"query parameter {k!r} is not allowed on {method} {route.template}"
                if k not in route.params else f"query parameter {k}={v[:100]!r} is not allowed"
                for k, v in params
                if k not in route.params or not route.params[k].fullmatch(v)]
    if reasons:
        return _refused(*reasons)

    groups = m.groupdict()
    ref, service = groups.get("ref") or "", groups.get("service") or ""
    slot = "ref" if ref else "service" if service else ""
    forward_path = prefix + (path[:m.start(slot)] + "{id}" + path[m.end(slot):]
                             if slot else path)
    if route.template in ("/nodes", "/services", "/tasks"):
        raw_filters = dict(params).get("filters")
        filters, service, reasons = swarm_policy.check_filters(route.template, raw_filters)
        if reasons:
            return _refused(*reasons)
        params = [(k, v) for k, v in params if k != "filters"]
        params += [("filters", filters)] if filters is not None else []
    query = urlencode(params)
    if method == "POST" and path == "/services/create":
        spec, reasons, status = swarm_policy.check_service_create(
            body, defaults() if settings is None else settings)
        if reasons:
            return _refused(*reasons, status=status)
        return Decision(True, path=forward_path, query=query,
                        body=json.dumps(spec, allow_nan=False).encode())
    if not (method == "POST" and path == "/containers/create"):
        if body:
            return _refused(f"{method} {path} takes no request body")
        return Decision(True, path=forward_path, query=query, container=ref, service=service)

    try:
        spec = strict_json(body)
    except BodyError as e:
        return _refused(f"container create body: {e}", status=400)
    reasons = CREATE_BODY(spec, "")
    if not reasons:
        reasons = _create_rules(spec, dict(params).get("name"),
                                defaults() if settings is None else settings)
    if reasons:
        return _refused(*reasons)
    return Decision(True, path=forward_path, query=query,
                    body=json.dumps(spec, allow_nan=False).encode())
