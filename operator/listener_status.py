"""status.listeners: where each listener of spec.listeners is reached, read from its
Service as the API server shows it (manifests/broker_group.py makes the Services)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from capstan.operator.manifests import names


def listener_status(
    group: str, namespace: str, listeners: Iterable[Mapping[str, Any]], services: Iterable[Any]
) -> list[dict[str, Any]]:
    """One entry per listener, in the spec's order: its Service, and the addresses clients
    use (a nodeport listener's node port is on every node's address); `ready` once the
    Service exists and, for a load balancer, once the cloud has given it an address."""
    by_name = {s.metadata.name: s for s in services}
    shown = []
    for listener in listeners:
        name, kind = str(listener["name"]), str(listener["type"])
        service_name = names.listener_service(group, name)
        entry: dict[str, Any] = {"name": name, "type": kind, "service": service_name}
        service = by_name.get(service_name)
        if service is None:
            shown.append({**entry, "addresses": [], "ready": False})
            continue
        port = names.BROKER_GRPC_PORT
        if kind == "internal":
            entry["addresses"] = [f"{service_name}.{namespace}.svc:{port}"]
        elif kind == "nodeport":
            node_port = next((p.node_port for p in service.spec.ports or () if p.node_port), None)
            entry["addresses"] = []
            if node_port is not None:
                entry["nodePort"] = int(node_port)
        else:
            ingress = (service.status.load_balancer.ingress if service.status else None) or ()
            entry["addresses"] = [f"{i.ip or i.hostname}:{port}" for i in ingress]
        entry["ready"] = bool(entry["addresses"] or entry.get("nodePort"))
        shown.append(entry)
    return shown
