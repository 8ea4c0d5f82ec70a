"""The GPUs and leases of a Swarm, read from its own objects (pure functions, no I/O).

Each GPU node carries its GPUs' UUIDs in an engine label
(:data:`~gpulab.contract.ENGINE_LABEL_GPUS`): :func:`inventory_from_nodes` turns the
usable nodes into the hub's inventory. Members' services carry their leases in the
labels the hub gave them (:func:`~gpulab.contract.lease_labels`, plus
:data:`~gpulab.contract.LABEL_NODE`): :func:`leases_from_services` reads them back, so a
hub restart loses nothing. The services themselves are made by
:mod:`gpulab.spawn.swarm_services`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpulab.contract import ENGINE_LABEL_GPUS
from gpulab.gpus.allocator import Gpu, Lease, leases_from_labels


def node_gpus(node: Mapping[str, Any]) -> list[str]:
    """The GPU UUIDs a node's engine label lists (the Docker API's node object)."""
    labels = ((node.get("Description") or {}).get("Engine") or {}).get("Labels") or {}
    return [u.strip() for u in (labels.get(ENGINE_LABEL_GPUS) or "").split(",") if u.strip()]


def node_usable(node: Mapping[str, Any]) -> bool:
    """Ready and active: a node that is down, or drained or paused by an admin, gets no
    new server."""
    state = (node.get("Status") or {}).get("State")
    availability = (node.get("Spec") or {}).get("Availability")
    return state == "ready" and availability == "active"


def inventory_from_nodes(nodes: Iterable[Mapping[str, Any]], model: str = "") -> list[Gpu]:
    """Every GPU of every usable node (:func:`node_usable`), with ``node`` its node ID
    and ``index`` its place in the node's label. A UUID listed by two nodes is a
    mislabelled node: it is left out of both, so it is never leased twice."""
    seen: dict[str, int] = {}
    listed = [(n, node_gpus(n)) for n in nodes]
    for _, uuids in listed:
        for u in uuids:
            seen[u] = seen.get(u, 0) + 1
    return [Gpu(i, u, model, node=str(n.get("ID") or ""), machine=node_name(n))
            for n, uuids in listed if node_usable(n)
            for i, u in enumerate(uuids) if seen[u] == 1]


def lease_holder(service: Mapping[str, Any]) -> dict[str, Any]:
    """A member's service (the Docker API's service object) in the shape the lease
    table reads a container in: its ID, labels, creation time and state."""
    return {"Id": service.get("ID", ""),
            "Names": [f"/{(service.get('Spec') or {}).get('Name', '')}"],
            "Labels": (service.get("Spec") or {}).get("Labels") or {},
            "Created": _epoch(service.get("CreatedAt")),
            "State": "running"}  # it holds its GPUs until the hub removes it


def leases_from_services(services: Iterable[Mapping[str, Any]]) -> list[Lease]:
    """The leases members' services hold, from the labels the hub gave them; since
    when: the service's creation. A service whose task has ended still holds its GPUs
    until the hub removes it (its server is then reported stopped), so that no GPU is
    given twice meanwhile."""
    return leases_from_labels(lease_holder(s) for s in services)


def node_name(node: Mapping[str, Any]) -> str:
    """A node's hostname, as members and admins know the machine (its ID otherwise)."""
    return ((node.get("Description") or {}).get("Hostname")) or str(node.get("ID") or "")


def _epoch(stamp: Any) -> float:
    """Docker's RFC 3339 time with nanoseconds -> seconds since the epoch (0 if none)."""
    if not isinstance(stamp, str) or not stamp:
        return 0.0
    text = stamp.rstrip("Z")
    whole, _, fraction = text.partition(".")
    try:
        at = datetime.fromisoformat(whole).replace(tzinfo=UTC)
    except ValueError:
        return 0.0
    return at.timestamp() + (float(f"0.{fraction}") if fraction.isdigit() else 0.0)
