"""spec.rack: tell each broker pod its zone, the value of its node's `topologyKey` label.

The pod's capstan.io/zone annotation carries it; the broker reads it from a downward-API
file (manifests/broker_group.py) at every heartbeat and reports it to the controller. A
pod's node never changes, so a pod is annotated once, as soon as it is scheduled; only
scheduled pods whose annotation is missing or stale cost a read of their node.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from capstan.operator.manifests import names

log = logging.getLogger(__name__)

NodeLabels = Callable[[str], Awaitable[Mapping[str, str] | None]]
"""The labels of a node by name (None: no such node)."""


def unlabelled(pods: Iterable[Any]) -> list[Any]:
    """The scheduled pods that carry no zone yet."""
    return [
        p
        for p in pods
        if p.spec is not None
        and p.spec.node_name
        and not (p.metadata.annotations or {}).get(names.ZONE_ANNOTATION)
    ]


async def zones_to_set(pods: Iterable[Any], key: str, node_labels: NodeLabels) -> dict[str, str]:
    """{pod: zone} for each scheduled pod without a zone whose node has the label `key`
    (each node read once)."""
    seen: dict[str, Mapping[str, str] | None] = {}
    wanted: dict[str, str] = {}
    for pod in unlabelled(pods):
        node = pod.spec.node_name
        if node not in seen:
            seen[node] = await node_labels(node)
        zone = (seen[node] or {}).get(key)
        if zone:
            wanted[pod.metadata.name] = zone
        else:
            log.warning(
                "pod %s runs on node %s, which has no %s label: its zone is unknown",
                pod.metadata.name,
                node,
                key,
            )
    return wanted
