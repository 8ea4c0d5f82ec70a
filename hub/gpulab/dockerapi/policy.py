"""What the Docker proxy lets through: the policy, as pure functions (no I/O).

Whoever can create containers through the Docker API is root on the host, so the hub's
only way to Docker (:mod:`gpulab.dockerapi.proxy`) lets through exactly the calls the hub
makes, and a container create only when it describes a hardened gpulab user container.

The policy decides on exactly what dockerd will act on. dockerd decodes a create body
with Go's ``encoding/json``, which merges duplicated objects, matches field names
case-insensitively (with Unicode folding: ``ſ`` matches ``s``, ``K`` matches ``k``),
ignores unknown keys, and reads a deprecated HostConfig at the top level of the body.
So :func:`proxy_verdict` refuses (and says why):

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
  process limits, another image than the lab's (``spawn.image``, or each of
  ``spawn.environments``' images), another network than
  ``spawn.network``, a name without :data:`~gpulab.contract.USER_CONTAINER_PREFIX`, GPUs
  requested by count (``-1`` is all of them) instead of by UUID, GPUs that differ from
  the container's lease label, or ``NVIDIA_VISIBLE_DEVICES`` other than the leased
  UUIDs (``void`` for none: images set ``all``, which the NVIDIA runtime honours);
* query parameters that are not on the route's allow-list, and request bodies outside
  a create.

What is forwarded is the checked object re-serialized (:attr:`ProxyVerdict.body`), never the
client's bytes, so dockerd acts on what was checked. A per-container call is allowed
here only provisionally: the proxy resolves :attr:`ProxyVerdict.container` to a full ID,
checks that container's managed label and forwards :meth:`ProxyVerdict.target` with that ID.

With ``swarm=True`` (the proxy in front of a Swarm manager) the service, task and node
calls of :mod:`gpulab.dockerapi.swarm_policy` are allowed too, and a per-service call (or a task
list, which names one service) is provisional in the same way: :attr:`ProxyVerdict.service`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

from gpulab.contract import (
    GPU_UUID,
    INFRA_VOLUMES,
    LABEL_GPUS,
    LOG_DRIVER,
    PROJECT_NAME,
    PROJECT_VOLUME_PREFIX,
    USER_CONTAINER_PREFIX,
    log_options,
)
from gpulab.dockerapi import swarm_policy
from gpulab.dockerapi.schema import (
    BIND,
    COUNT,
    HEALTHCHECK,
    IMAGE,
    NAME,
    REF,
    REGISTRY,
    SIGNAL,
    SIZE,
    STRINGS,
    BodyError,
    abs_path,
    array,
    bind,
    boolean,
    either,
    exactly,
    mapping,
    normal_image,
    obj,
    strict_json,
    text,
    user,
)
from gpulab.environments import lab_images
from gpulab.settings import defaults
from gpulab.spawn.naming import home_volume_pattern

# API versions below 1.24 let a start request carry a HostConfig that replaces the
# checked one; DeviceRequests need 1.40. Older clients are refused.
MIN_API_VERSION = (1, 40)
# The read-only calls (ping, version, the container and node lists) carry no body whose
# meaning a version could change, so they are answered from 1.24 on: the version a Docker
# client falls back to when its version negotiation's ping fails, which it then keeps
# for good. Prometheus' Swarm discovery did, once, when its first ping came before this
# proxy answered (and then never found an exporter).
MIN_READ_ONLY_API_VERSION = (1, 24)
_VERSION = re.compile(r"/v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(?=/)")
_PORT = re.compile(r"[1-9][0-9]{0,4}/(tcp|udp|sctp)")
NO_NEW_PRIVILEGES = ("no-new-privileges", "no-new-privileges:true", "no-new-privileges=true")




@dataclass(frozen=True)
class ProxyVerdict:
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
        path, query = self.path, self.query
        if self.container or self.service:
            path = path.replace("{id}", object_id)
        if self.service:
            query = query.replace(swarm_policy.ID_SLOT, object_id)
        return f"{path}?{query}" if query else path


def _refused(*reasons: str, status: int = 403) -> ProxyVerdict:
    return ProxyVerdict(False, tuple(reasons), status=status)




# ---------------------------------------------------------------- the allow-list


# NetworkingConfig.EndpointsConfig[network]: none of the endpoint settings is needed,
# and Aliases, IPAddress, IPAMConfig, MacAddress or Links could take the hub's identity.
ENDPOINT_SETTINGS = obj({}, unknown="it could take the hub's name or address")
NETWORKING_CONFIG = obj({
    "EndpointsConfig": mapping(REF, "a network name", ENDPOINT_SETTINGS),
})
DEVICE_REQUEST = obj({
    "Driver": exactly("nvidia"),
    # -1 is every GPU, a positive count any GPUs: GPUs are named (DeviceIDs).
    "Count": exactly(0, why="GPU requests name their devices (DeviceIDs), not a count"),
    "DeviceIDs": array(text(GPU_UUID, "a GPU UUID (GPU-... or MIG-...)"), min_items=1),
    "Capabilities": exactly([["gpu"]]),
    "Options": exactly({}),
}, required=("Driver", "DeviceIDs", "Capabilities"))
MOUNT = obj({
    "Type": exactly("volume"),
    "Source": text(REF, "a volume name"),
    "Target": abs_path,
    "ReadOnly": boolean,
}, required=("Type", "Source", "Target"))
HOST_CONFIG = obj({
    "Binds": array(bind),
    "Mounts": array(MOUNT),
    "Links": exactly([], why="links are not allowed"),
    "CapDrop": exactly(["ALL"], why="containers must drop all capabilities"),
    "SecurityOpt": exactly(*([s] for s in NO_NEW_PRIVILEGES),
                           why="containers run with no-new-privileges and no other security "
                               "option"),
    "NetworkMode": text(REF, "a network name"),  # == spawn.network, below
    "Memory": SIZE,
    "MemorySwap": SIZE,  # >= Memory, below
    "ShmSize": SIZE,
    "PidsLimit": SIZE,
    "CpuQuota": COUNT,
    "CpuPeriod": COUNT,
    "NanoCpus": COUNT,
    "Init": boolean,
    "AutoRemove": boolean,
    "DeviceRequests": array(DEVICE_REQUEST, max_items=1),
    "LogConfig": exactly({"Type": LOG_DRIVER, "Config": log_options()},
                         why="a member's server's log rotates (gpulab.contract.LOG_MAX_SIZE), "
                             "or it could fill the host's disk"),
}, required=("CapDrop", "SecurityOpt", "NetworkMode", "Memory", "PidsLimit", "LogConfig"))
# The top level is container.Config; dockerd also reads a deprecated HostConfig there,
# so no HostConfig key may appear at the top level.
CREATE_BODY = obj({
    "Image": text(IMAGE, "an image name"),  # == spawn.image, below
    "User": user,
    "Cmd": STRINGS,
    "Entrypoint": STRINGS,
    "WorkingDir": either(exactly(""), abs_path),
    "Env": array(text(re.compile(r"[^=\x00]+=[^\x00]*", re.S), "KEY=VALUE")),
    "Labels": mapping(re.compile(r".+", re.S), "a label name", text()),
    "ExposedPorts": mapping(_PORT, "a port such as 8888/tcp", exactly(None, {})),
    "Volumes": mapping(re.compile(r"/.*", re.S), "an absolute path", exactly(None, {})),
    "Tty": boolean, "OpenStdin": boolean, "StdinOnce": boolean, "AttachStdin": boolean,
    "AttachStdout": boolean, "AttachStderr": boolean, "NetworkDisabled": boolean,
    "StopSignal": text(SIGNAL, "a signal"),
    "StopTimeout": COUNT,
    "Healthcheck": HEALTHCHECK,
    "HostConfig": HOST_CONFIG,
    "NetworkingConfig": NETWORKING_CONFIG,
}, required=("Image", "User", "Env", "Labels", "HostConfig"))




# A volume create: only a member's home with the size spawn.home_size gives it, or a group
# project folder with spawn.project_size's. The local driver's other options (type,
# device, o) would mount a host folder or device, or another machine's share, into
# whatever mounts the volume.
VOLUME_CREATE_BODY = obj({
    "Name": text(REF, "a volume name"),
    "Driver": exactly("local", why="homes and project folders use Docker's local driver"),
    "DriverOpts": obj({"size": text(re.compile(r"[1-9][0-9]{0,18}"), "a size in bytes")},
                      required=("size",),
                      unknown="only a volume's size is set; the local driver's other options "
                              "mount host folders, devices or shares"),
    "Labels": exactly(None, {}),
}, required=("Name", "Driver", "DriverOpts"), unknown="gpulab's homes never need it")


def _body_verdict(body: bytes, what: str, schema, rules, path: str, query: str
                  ) -> ProxyVerdict:
    """A create's *body*: strict JSON, on the allow-list (*schema*), then the lab's
    *rules* (spec -> reasons); forwarded as the checked object, re-serialized."""
    try:
        spec = strict_json(body)
    except BodyError as e:
        return _refused(f"{what} body: {e}", status=400)
    reasons = schema(spec, "") or rules(spec)
    if reasons:
        return _refused(*reasons)
    return ProxyVerdict(True, path=path, query=query,
                        body=json.dumps(spec, allow_nan=False).encode())


def _volume_rules(spec: dict[str, Any], settings: Mapping[str, Any]) -> list[str]:
    """What :data:`VOLUME_CREATE_BODY` cannot say alone: a home's or a group project
    folder's name, and the size the lab gives it."""
    reasons = []
    name, template = spec["Name"], settings["spawn.home_volume"]
    setting, kind = "spawn.home_size", "home"
    if name.startswith(PROJECT_VOLUME_PREFIX) and PROJECT_NAME.fullmatch(
            name[len(PROJECT_VOLUME_PREFIX):]):
        setting, kind = "spawn.project_size", "project folder"
    elif name in INFRA_VOLUMES or name == settings["spawn.datasets_volume"] \
            or not home_volume_pattern(template).fullmatch(name):
        reasons.append(f"Name: only members' homes ({template}, spawn.home_volume) and "
                       f"group project folders ({PROJECT_VOLUME_PREFIX}NAME) are created, "
                       f"got {name!r}")
    size, asked = settings[setting], spec["DriverOpts"]["size"]
    if not size:
        reasons.append(f"DriverOpts.size: {setting} is not set, so no {kind} is "
                       f"created apart from its container")
    elif asked != str(size):
        reasons.append(f"DriverOpts.size: {kind}s hold {size} bytes ({setting}), "
                       f"got {asked!r}")
    return reasons


def _create_rules(spec: dict[str, Any], name: str | None, settings: Mapping[str, Any]
                  ) -> list[str]:
    """What the allow-list cannot say alone: the lab's settings and the lease. *spec*
    has passed :data:`CREATE_BODY`."""
    reasons = []
    hc = spec["HostConfig"]
    if name is None or not name.startswith(USER_CONTAINER_PREFIX) or not re.fullmatch(
            r"[A-Za-z0-9][A-Za-z0-9_.-]+", name) or name == USER_CONTAINER_PREFIX:
        reasons.append(f"name: user containers are named {USER_CONTAINER_PREFIX}<user>"
                       f"[--<server>] "
                       f"(a valid Docker name), got {name!r}")
    images = lab_images(settings)
    if normal_image(spec["Image"]) not in {normal_image(i) for i in images}:
        reasons.append(f"Image: only the lab's images may be run ({', '.join(images)}: "
                       f"spawn.image or spawn.environments), got {spec['Image']!r}")
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
    volumes = [(m.group(1), m.group(3) == "ro") for m in map(BIND.fullmatch, hc.get("Binds", []))]
    volumes += [(m["Source"], m.get("ReadOnly") is True) for m in hc.get("Mounts", [])]
    for volume, read_only in volumes:
        if volume in INFRA_VOLUMES and volume != datasets:
            reasons.append(f"HostConfig: volume {volume} is gpulab's own")
        elif volume == datasets and not read_only:
            reasons.append(f"HostConfig: the datasets volume {volume} is mounted read-only")
    reasons += [r for path in spec.get("Volumes", {}) for r in abs_path(path, "Volumes")]

    labels = spec["Labels"]
    more, leased = swarm_policy.lease_label_reasons(labels, "Labels", name)
    reasons += more
    if LABEL_GPUS not in labels:
        return reasons
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
    swarm: bool = False  # only in front of a Swarm manager (gpulab.dockerapi.swarm_policy)


def _route(method: str, path: str, read_only: bool = False, swarm: bool = False,
           **params: re.Pattern) -> Route:
    pattern = path
    for group in ("ref", "service", "node"):  # container, service, node references
        pattern = pattern.replace(f"{{{group}}}", f"(?P<{group}>{NAME})")
    return Route(method, path, re.compile(pattern), params, read_only, swarm)


# As in an image reference (docker_schema.IMAGE); docker-py sends a digest's @ as %40.
_IMAGE_PATH = (rf"({REGISTRY})?{NAME}(/{NAME})*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?"
               r"((@|%40)sha256:[0-9a-f]{64})?")
ROUTES: tuple[Route, ...] = (
    _route("GET", "/_ping", read_only=True),
    _route("HEAD", "/_ping", read_only=True),
    _route("GET", "/version", read_only=True),
    _route("GET", "/containers/json", read_only=True, all=_BOOL, filters=_ANY,
           limit=_INTEGER, size=_BOOL, trunc_cmd=_BOOL, since=REF, before=REF),
    _route("POST", "/containers/create", name=_ANY),  # the name is checked with the body
    _route("GET", "/containers/{ref}/json"),
    _route("GET", "/containers/{ref}/logs", stdout=_BOOL, stderr=_BOOL, timestamps=_BOOL,
           follow=_FALSE, tail=re.compile("all|[0-9]{1,9}"), since=_TIME, until=_TIME),
    _route("POST", "/containers/{ref}/start"),
    _route("POST", "/containers/{ref}/stop", t=_INTEGER, signal=SIGNAL),
    _route("POST", "/containers/{ref}/kill", signal=SIGNAL),
    _route("DELETE", "/containers/{ref}", v=_BOOL, force=_BOOL, link=_FALSE),
    _route("GET", f"/images/{_IMAGE_PATH}/json"),
    _route("GET", f"/volumes/{NAME}"),
    _route("POST", "/volumes/create"),  # a home or project folder of its size, below
    # A Swarm manager: what a SwarmSpawner-style spawner calls (docker-py's create_service,
    # inspect_service, services, remove_service, tasks) and the nodes the hub places
    # servers on (their GPUs are in each node's engine label). No updates of services or
    # nodes, no secrets, configs, swarm init/join/leave, plugins or task logs. A
    # service's log (a member's server that failed to start: its last lines, for her), as
    # a container's: no follow.
    _route("POST", "/services/create", swarm=True),
    _route("GET", "/services", swarm=True, filters=_ANY, status=_BOOL),
    _route("GET", "/services/{service}", swarm=True, insertDefaults=_BOOL),
    _route("DELETE", "/services/{service}", swarm=True),
    _route("GET", "/services/{service}/logs", swarm=True, stdout=_BOOL, stderr=_BOOL,
           timestamps=_BOOL, details=_FALSE, follow=_FALSE, since=_TIME,
           tail=re.compile("all|[0-9]{1,9}")),
    _route("GET", "/tasks", swarm=True, filters=_ANY),
    # Also for read-only clients: Prometheus finds the exporters of a Swarm's machines in
    # the node list (monitoring/prometheus/prometheus.swarm.yml); it holds no secret.
    _route("GET", "/nodes", read_only=True, swarm=True, filters=_ANY),
    _route("GET", "/nodes/{node}", swarm=True),
)


def _split_version(raw_path: str) -> tuple[str, str]:
    """'/v1.41/containers/json' -> ('/v1.41', '/containers/json')."""
    version = _VERSION.match(raw_path)
    prefix = version.group(0) if version else ""
    return prefix, raw_path[len(prefix):]


def is_create(method: str, target: str) -> bool:
    """Will :func:`proxy_verdict` need the lab's settings for this call (a container or service
    create)?"""
    return method == "POST" and _split_version(target.split("?", 1)[0])[1] in (
        "/containers/create", "/services/create", "/volumes/create")


def is_service_create(method: str, target: str) -> bool:
    """Will :func:`proxy_verdict` need ``spawn.image``'s ID on the manager (a service create)?"""
    return method == "POST" and _split_version(target.split("?", 1)[0])[1] == (
        "/services/create")


def proxy_verdict(method: str, target: str, body: bytes = b"", *,
                  settings: Mapping[str, Any] | None = None, read_only: bool = False,
                  swarm: bool = False,
                  image_ids: Mapping[str, str | None] | None = None) -> ProxyVerdict:
    """May the hub make this Docker API call (method, request target, body)?

    *settings* are the lab's (``spawn.image``, ``spawn.network``,
    ``spawn.datasets_volume``; default :func:`gpulab.settings.defaults`); *read_only*
    allows only ping, version and the container list (the exporter's proxy); *swarm*
    adds the service, task and node calls (the proxy in front of a Swarm manager), and
    *image_ids* are then the lab's images (``gpulab.environments.lab_images``) by
    name, each with its ID on the manager (None: it has no such image): the IDs a
    service may name.
    """

    if "#" in target or not target.startswith("/"):
        return _refused(f"request target {target[:200]!r} is not a plain path", status=400)
    raw_path, _, raw_query = target.partition("?")
    prefix, path = _split_version(raw_path)
    version = tuple(map(int, prefix[2:].split("."))) if prefix else None
    if version and version < MIN_READ_ONLY_API_VERSION:
        return _refused(f"Docker API versions below "
                        f"{'.'.join(map(str, MIN_READ_ONLY_API_VERSION))} are refused")
    routes = [r for r in ROUTES if (r.read_only or not read_only) and (swarm or not r.swarm)]
    match = next(((r, m) for r in routes if r.method == method
                  for m in [r.path.fullmatch(path)] if m), None)
    if match is None:
        who = "a read-only client" if read_only else "the hub"
        return _refused(f"{method} {path[:200]} is not among the calls {who} needs")
    route, m = match
    if version and not route.read_only and version < MIN_API_VERSION:
        return _refused(f"Docker API versions below "
                        f"{'.'.join(map(str, MIN_API_VERSION))} are refused for "
                        f"{method} {path[:200]} (only read-only calls are answered from "
                        f"{'.'.join(map(str, MIN_READ_ONLY_API_VERSION))})")
    if route.swarm and not route.read_only and version and version < (
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
            body, defaults() if settings is None else settings, image_ids or {})
        if reasons:
            return _refused(*reasons, status=status)
        return ProxyVerdict(True, path=forward_path, query=query,
                            body=json.dumps(spec, allow_nan=False).encode())
    if method == "POST" and path == "/volumes/create":
        lab = defaults() if settings is None else settings
        return _body_verdict(body, "volume create", VOLUME_CREATE_BODY,
                             lambda spec: _volume_rules(spec, lab), forward_path, query)
    if not (method == "POST" and path == "/containers/create"):
        if body:
            return _refused(f"{method} {path} takes no request body")
        return ProxyVerdict(True, path=forward_path, query=query, container=ref, service=service)

    lab = defaults() if settings is None else settings
    return _body_verdict(body, "container create", CREATE_BODY,
                         lambda spec: _create_rules(spec, dict(params).get("name"), lab),
                         forward_path, query)
