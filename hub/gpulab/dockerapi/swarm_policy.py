"""What the Docker proxy lets through to a Swarm manager: services, tasks and nodes, as
pure functions (no I/O). :mod:`gpulab.dockerapi.policy` routes the calls here when the proxy
runs with ``--swarm``.

A service create on a manager is a container create on any node, so it gets the same
strictness as a container create (strict JSON, keys on an allow-list by their exact
spelling at every level, JSON types checked) and is allowed only when the spec describes
one hardened member server of this lab, placed on one node the hub chose:

* ``Name`` with :data:`~gpulab.contract.USER_CONTAINER_PREFIX`; ``Mode`` exactly one
  replica; ``RestartPolicy`` ``none`` (a server that dies is reported stopped and its
  lease released, never restarted elsewhere with the same GPU UUIDs);
* ``Placement.Constraints`` exactly ``["node.id==<id>"]`` and nothing else that could
  widen or move placement (no preferences, platforms, max replicas). A node ID, not a
  hostname: IDs are unique and given by the Swarm at join, hostnames can repeat or
  change, and a GPU UUID leased on one machine must never land on another;
* the labels :data:`~gpulab.contract.LABEL_MANAGED`, ``LABEL_USER``, ``LABEL_GPUS`` and
  :data:`~gpulab.contract.LABEL_NODE` (the constraint's node) on the service, the first
  three also on its containers (the exporter on each node attributes by them);
* ``ContainerSpec``: one of the lab's images (the images of ``spawn.environments``, or
  ``spawn.image`` without them) by its image ID on the manager (``sha256:...``), never by
  name: a machine given a name asks a registry for it before every start and runs what
  the registry sends (Docker Hub's ``gpulab/singleuser`` is anyone's to take),
  while a machine given an ID asks nobody and runs exactly that image, or fails with
  ``No such image``; a numeric non-root ``User``; ``CapabilityDrop``
  exactly ``["ALL"]``; named volumes only (not gpulab's own, the datasets read-only, no
  driver options: ``local`` with ``o=bind`` is a host path), and a sized tmpfs on
  ``/dev/shm`` only; ``NVIDIA_VISIBLE_DEVICES``
  exactly the leased UUIDs (``void`` for none) and no other ``NVIDIA_*`` setting. No
  ``CapabilityAdd``, ``Privileges`` (SELinux, credential specs, and the Seccomp/AppArmor
  overrides newer engines read there), ``Sysctls``, ``Isolation``, ``Groups``,
  ``Ulimits``, ``Hosts``, ``DNSConfig``, ``Secrets`` or ``Configs``;
* ``Resources.Limits`` with ``MemoryBytes`` and ``Pids`` (API 1.41); no
  ``GenericResources``: GPUs in generic resources are rejected by every node update
  (docs/swarm.md), so they go by ``NVIDIA_VISIBLE_DEVICES`` with NVIDIA's runtime as the
  nodes' default runtime;
* ``Networks`` exactly ``[{"Target": spawn.network}]`` (an overlay; no aliases, no
  driver options) and ``EndpointSpec`` exactly ``{"Mode": "dnsrr"}``: no published
  ports, no virtual IP (which needs IPVS). The deprecated top-level ``Networks``, which
  dockerd still reads, is refused like every key not listed.

Service, task and node calls need API 1.41 (or an unversioned path): dockerd drops
``CapabilityDrop`` and the pids limit from a spec sent to an older version. List calls
reveal whole specs (environment included), so a service list must filter on
``org.gpulab.managed=true`` and a task list on exactly one service, which the proxy
resolves and checks as it does per-service calls (:attr:`ProxyVerdict.service`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gpulab.contract import (
    GPU_UUID,
    INFRA_VOLUMES,
    LABEL_GPUS,
    LABEL_MANAGED,
    LABEL_NODE,
    LABEL_SERVER,
    LABEL_USER,
    LOG_DRIVER,
    USER_CONTAINER_PREFIX,
    log_options,
)
from gpulab.dockerapi.schema import (
    COUNT,
    HEALTHCHECK,
    IMAGE,
    IMAGE_ID,
    REF,
    SIGNAL,
    SIZE,
    STRINGS,
    BodyError,
    abs_path,
    array,
    boolean,
    either,
    exactly,
    mapping,
    obj,
    strict_json,
    text,
    user,
)
from gpulab.spawn.naming import container_name

MIN_API_VERSION = (1, 41)  # CapabilityDrop, Pids in service specs
_CONSTRAINT = re.compile(r"node\.id==([0-9a-z]{25})")
# Stands for the resolved service ID in a task list's forwarded query (never a real ID:
# those are lowercase).
ID_SLOT = "GPULABSERVICEID"

_LABELS = mapping(re.compile(r".+", re.S), "a label name", text())

VOLUME_MOUNT = obj({
    "Type": exactly("volume"),
    "Source": text(REF, "a volume name"),
    "Target": abs_path,
    "ReadOnly": boolean,
}, required=("Type", "Source", "Target"))
# A service has no ShmSize: /dev/shm (DataLoader workers) is a sized tmpfs there, and
# only there (memory, not a host path).
SHM_MOUNT = obj({
    "Type": exactly("tmpfs"),
    "Target": exactly("/dev/shm", why="a tmpfs goes only on /dev/shm"),
    "TmpfsOptions": obj({"SizeBytes": SIZE}, required=("SizeBytes",)),
}, required=("Type", "Target", "TmpfsOptions"))
MOUNT = either(SHM_MOUNT, VOLUME_MOUNT)  # a refusal explains the volume rules
CONTAINER_SPEC = obj({
    "Image": text(IMAGE, "an image name"),  # == spawn.image's ID, below
    "Labels": _LABELS,
    # docker-py's ContainerSpec always writes both, null when not given
    "Command": either(exactly(None), STRINGS),
    "Args": either(exactly(None), STRINGS),
    "Env": array(text(re.compile(r"[^=\x00]+=[^\x00]*", re.S), "KEY=VALUE")),
    "Dir": either(exactly(""), abs_path),
    "User": user,
    "Init": boolean,
    "StopSignal": text(SIGNAL, "a signal"),
    "StopGracePeriod": COUNT,
    "Healthcheck": HEALTHCHECK,
    "Mounts": array(MOUNT),
    "CapabilityDrop": exactly(["ALL"], why="members' servers must drop all capabilities"),
}, required=("Image", "Labels", "Env", "User", "CapabilityDrop"),
   unknown="gpulab's member servers never need it")
RESOURCES = obj({
    "Limits": obj({"MemoryBytes": SIZE, "NanoCPUs": COUNT, "Pids": SIZE},
                  required=("MemoryBytes", "Pids")),
    "Reservations": obj({"MemoryBytes": COUNT, "NanoCPUs": COUNT},
                        unknown="GPUs go by NVIDIA_VISIBLE_DEVICES, not generic resources"),
}, required=("Limits",))
TASK_TEMPLATE = obj({
    "ContainerSpec": CONTAINER_SPEC,
    "Resources": RESOURCES,
    "RestartPolicy": obj({
        "Condition": exactly("none", why="a member's server is never restarted by the Swarm"),
        "Delay": COUNT, "MaxAttempts": COUNT, "Window": COUNT,  # docker-py writes them
    }, required=("Condition",)),
    "Placement": obj({
        "Constraints": array(text(_CONSTRAINT, "node.id==<node ID>"), 1, 1),
    }, required=("Constraints",), unknown="the hub places each server on one node"),
    "Networks": array(obj({"Target": text(REF, "a network name")}, required=("Target",),
                          unknown="it could take another server's or the hub's name"),
                      1, 1),
    "LogDriver": exactly({"Name": LOG_DRIVER, "Options": log_options()},
                         why="a member's server's log rotates (gpulab.contract.LOG_MAX_SIZE), "
                             "or it could fill a machine's disk"),
}, required=("ContainerSpec", "Resources", "RestartPolicy", "Placement", "Networks",
             "LogDriver"),
   unknown="gpulab's member servers never need it")
SERVICE_SPEC = obj({
    "Name": text(re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]+"), "a service name", 63),
    "Labels": _LABELS,
    "TaskTemplate": TASK_TEMPLATE,
    # docker-py's ServiceMode spells it "replicated"; either spelling, never both
    "Mode": exactly({"Replicated": {"Replicas": 1}}, {"replicated": {"Replicas": 1}},
                    why="one replica per member server"),
    "EndpointSpec": exactly({"Mode": "dnsrr"},
                            why="no published ports and no virtual IP (DNS round-robin)"),
}, required=("Name", "Labels", "TaskTemplate", "Mode", "EndpointSpec"),
   unknown="gpulab's member servers never need it")


def lease_label_reasons(labels: Mapping[str, str], where: str, name: str | None
                        ) -> tuple[list[str], list[str]]:
    """(reasons, leased UUIDs) for the lease's labels in *labels* (managed, user, server,
    GPUs) and the container's or service's *name*, which must be its user's and server's
    (:func:`gpulab.spawn.naming.container_name`): the exporter, the culler and the lease
    table read a server from its labels, so no label may say another's."""
    reasons = []
    if labels.get(LABEL_MANAGED) != "true":
        reasons.append(f"{where}: {LABEL_MANAGED} must be 'true'")
    if not labels.get(LABEL_USER):
        reasons.append(f"{where}: {LABEL_USER} must name the user")
    if LABEL_SERVER not in labels:
        reasons.append(f"{where}: {LABEL_SERVER} is required ('' for her default server)")
    elif labels.get(LABEL_USER) and name is not None and name != container_name(
            labels[LABEL_USER], labels[LABEL_SERVER]):
        reasons.append(f"{where}: {name!r} is not the name of {labels[LABEL_USER]!r}'s server "
                       f"{labels[LABEL_SERVER]!r} "
                       f"({container_name(labels[LABEL_USER], labels[LABEL_SERVER])!r})")
    if LABEL_GPUS not in labels:
        return [*reasons, f"{where}: {LABEL_GPUS} is required ('' for no GPU)"], []
    leased = labels[LABEL_GPUS].split(",") if labels[LABEL_GPUS] else []
    if any(not GPU_UUID.fullmatch(u) for u in leased) or len(set(leased)) != len(leased):
        reasons.append(f"{where}: {LABEL_GPUS} must be distinct GPU UUIDs joined by ',', "
                       f"got {labels[LABEL_GPUS]!r}")
    return reasons, leased


def _named(image_ids: Mapping[str, str | None]) -> str:
    return ", ".join(f"{name} is {image_id}" for name, image_id in image_ids.items())


def image_refusal(image_ids: Mapping[str, str | None], image: str) -> str | None:
    """Why a service naming *image* cannot be created while the manager lacks lab images
    (*image_ids*: each of the lab's images by name, with its ID on the manager or None),
    else None. A service naming the ID of one that is there is not held up by another
    that is missing."""
    missing = [name for name, image_id in image_ids.items() if image_id is None]
    if not missing or not IMAGE_ID.fullmatch(image) or image in image_ids.values():
        return None  # a name, or a present image: service_rules says the rest
    what = (f"the lab's image {missing[0]} is" if len(missing) == 1 else
            f"the lab's images {', '.join(missing)} are")
    return (f"{what} not on the Swarm's manager (spawn.image, spawn.environments), and "
            f"services run them by the ID they have there; build or load them on the "
            f"manager (make images)")


def service_rules(spec: dict[str, Any], settings: Mapping[str, Any],
                  image_ids: Mapping[str, str | None]) -> list[str]:
    """What the allow-list cannot say alone: the lab's settings, the lease and the node.
    *spec* has passed :data:`SERVICE_SPEC`; *image_ids*: the lab's images by name
    (:func:`gpulab.environments.lab_images`: the environments' images, or ``spawn.image``
    when none are listed), each with its ID on the manager."""
    reasons = []
    name = spec["Name"]
    if not name.startswith(USER_CONTAINER_PREFIX) or name == USER_CONTAINER_PREFIX:
        reasons.append(f"Name: members' servers are named {USER_CONTAINER_PREFIX}<user>"
                       f"[--<server>], "
                       f"got {name!r}")
    task = spec["TaskTemplate"]
    cs = task["ContainerSpec"]
    present = {name: i for name, i in image_ids.items() if i is not None}
    if cs["Image"] in present.values():
        pass
    elif IMAGE_ID.fullmatch(cs["Image"]):
        reasons.append(f"TaskTemplate.ContainerSpec.Image: {cs['Image']} is none of the "
                       f"lab's images on this manager now ({_named(present)}): one was "
                       f"rebuilt or retagged while the server was starting; start it again")
    else:
        reasons.append(f"TaskTemplate.ContainerSpec.Image: only the lab's images "
                       f"(spawn.image, spawn.environments) may be run, by their IDs on "
                       f"this manager ({_named(present)}; by name, each machine would ask "
                       f"a registry for it first), got {cs['Image']!r}")
    network = settings["spawn.network"]
    target = task["Networks"][0]["Target"]
    if target != network:
        reasons.append(f"TaskTemplate.Networks: only the users' network {network} "
                       f"(spawn.network), got {target!r}")

    datasets = settings["spawn.datasets_volume"]
    for m in cs.get("Mounts", []):
        if m["Type"] != "volume":
            continue
        if m["Source"] in INFRA_VOLUMES and m["Source"] != datasets:
            reasons.append(f"TaskTemplate.ContainerSpec.Mounts: volume {m['Source']} is "
                           f"gpulab's own")
        elif m["Source"] == datasets and m.get("ReadOnly") is not True:
            reasons.append(f"TaskTemplate.ContainerSpec.Mounts: the datasets volume "
                           f"{datasets} is mounted read-only")

    labels = spec["Labels"]
    more, leased = lease_label_reasons(labels, "Labels", name)
    reasons += more
    node = _CONSTRAINT.fullmatch(task["Placement"]["Constraints"][0]).group(1)
    if labels.get(LABEL_NODE) != node:
        reasons.append(f"Labels: {LABEL_NODE} must be the node of the placement constraint "
                       f"{node!r}, got {labels.get(LABEL_NODE)!r}")
    for key in (LABEL_MANAGED, LABEL_USER, LABEL_SERVER, LABEL_GPUS):
        if cs["Labels"].get(key) != labels.get(key):
            reasons.append(f"TaskTemplate.ContainerSpec.Labels: {key} must be the service's "
                           f"{labels.get(key)!r}, got {cs['Labels'].get(key)!r}")

    env = [e.split("=", 1) for e in cs["Env"]]
    visible = [v for k, v in env if k == "NVIDIA_VISIBLE_DEVICES"]
    want = ",".join(leased) or "void"
    if visible != [want]:
        reasons.append(f"TaskTemplate.ContainerSpec.Env: NVIDIA_VISIBLE_DEVICES must be set "
                       f"once, to {want!r} (the leased GPUs), got {visible}")
    reasons += [f"TaskTemplate.ContainerSpec.Env: {k} is not allowed (only "
                f"NVIDIA_VISIBLE_DEVICES of the NVIDIA runtime's settings)" for k, _ in env
                if k.startswith("NVIDIA_") and k != "NVIDIA_VISIBLE_DEVICES"]
    return reasons


def check_service_create(body: bytes, settings: Mapping[str, Any],
                         image_ids: Mapping[str, str | None]
                         ) -> tuple[dict[str, Any] | None, list[str], int]:
    """(the checked spec, reasons, status) for a service create body; *image_ids*: the
    lab's images by name, each with its ID on the manager (None: not there)."""
    try:
        spec = strict_json(body)
    except BodyError as e:
        return None, [f"service create body: {e}"], 400
    reasons = SERVICE_SPEC(spec, "")
    if not reasons and (missing := image_refusal(
            image_ids, spec["TaskTemplate"]["ContainerSpec"]["Image"])):
        return None, [missing], 503
    if not reasons:
        reasons = service_rules(spec, settings, image_ids)
    return (None if reasons else spec), reasons, 403


# ---------------------------------------------------------------- list filters

_STATE = re.compile(r"running|shutdown|accepted")
_LABEL_FILTER = re.compile(r"[^=\x00]+(=[^\x00]*)?")
_NAME_FILTER = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_NODE_FILTERS = {"id": _NAME_FILTER, "name": _NAME_FILTER, "label": _LABEL_FILTER,
                 "node.label": _LABEL_FILTER, "role": re.compile(r"manager|worker"),
                 "membership": re.compile(r"accepted|pending")}
_SERVICE_FILTERS = {"id": _NAME_FILTER, "name": _NAME_FILTER, "label": _LABEL_FILTER}
_TASK_FILTERS = {"service": re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"),
                 "desired-state": _STATE}


def parse_filters(raw: str, allowed: Mapping[str, re.Pattern]
                  ) -> tuple[dict[str, list[str]], list[str]]:
    """Docker's ``filters`` parameter, ``{"key": ["value", ...]}`` or ``{"key": {"value":
    true}}``, read strictly: (key -> sorted distinct values, reasons)."""
    try:
        value = strict_json(raw.encode())
    except BodyError as e:
        return {}, [f"filters: {e}"]
    if not isinstance(value, dict):
        return {}, ["filters: expected an object"]
    out, reasons = {}, []
    for key, values in value.items():
        if key not in allowed:
            reasons.append(f"filters: {key!r} is not allowed (only {', '.join(allowed)})")
            continue
        if isinstance(values, dict) and all(v is True for v in values.values()):
            values = list(values)
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            reasons.append(f"filters: {key} must be a list of strings or an object of "
                           f"strings to true")
            continue
        reasons += [f"filters: {key}={v[:100]!r} is not allowed" for v in values
                    if not allowed[key].fullmatch(v)]
        out[key] = sorted(set(values))
    return out, reasons


def encode_filters(filters: Mapping[str, list[str]]) -> str:
    return json.dumps({k: dict.fromkeys(v, True) for k, v in sorted(filters.items())})


def check_filters(template: str, raw: str | None) -> tuple[str | None, str, list[str]]:
    """For the list routes: (filters to forward or None, service reference to resolve
    (task lists), reasons)."""
    if template == "/nodes":
        if raw is None:
            return None, "", []
        filters, reasons = parse_filters(raw, _NODE_FILTERS)
        return encode_filters(filters), "", reasons
    if template == "/services":
        filters, reasons = parse_filters(raw or "{}", _SERVICE_FILTERS)
        managed = [v for v in filters.get("label", []) if v.split("=", 1)[0] == LABEL_MANAGED]
        if managed != [f"{LABEL_MANAGED}=true"]:
            reasons.append(f"filters: a service list filters on exactly "
                           f"label={LABEL_MANAGED}=true (specs hold other services' "
                           f"environment), got {managed}")
        return encode_filters(filters), "", reasons
    # /tasks
    filters, reasons = parse_filters(raw or "{}", _TASK_FILTERS)
    services = filters.get("service", [])
    if len(services) != 1:
        reasons.append(f"filters: a task list names exactly one service (service=...), got "
                       f"{services}")
        return None, "", reasons
    filters["service"] = [ID_SLOT]
    return encode_filters(filters), services[0], reasons
