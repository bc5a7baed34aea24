"""What the controller says of a broker group, by pod name, for the roller and the status.

Brokers in a cluster register under their stable DNS names, `<pod>.<service>.<namespace>
.svc[...]:<port>`, so the first label of a replica's host is its pod's name. Replicas
registered under other addresses (a broker run outside the StatefulSet) are left out.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from capstan.operator.roller import GroupView
from capstan.v1 import controller_pb2 as pb


def pod_of(address: str, pods: Collection[str]) -> str | None:
    """The pod a replica's address names, if it is one of `pods`."""
    host = address.rsplit(":", 1)[0]
    name = host.split(".", 1)[0]
    return name if name in pods and "." in host else None


@dataclass(frozen=True)
class GroupReport:
    view: GroupView
    status: dict[str, Any]
    """The BrokerGroup status fields the controller decides: master (pod), epoch,
    syncStateSet (pod names), inSyncReplicas, replicas (per pod: brokerId, alive, inSync,
    lagBytes, and zone when the broker reports one)."""


def report(info: pb.ReplicaInfo, pods: Collection[str]) -> GroupReport:
    by_id = {r.broker_id: r for r in info.replicas}
    master = by_id.get(info.master_id)
    master_pod = pod_of(master.address, pods) if master is not None else None
    master_offset = master.max_offset if master is not None else 0
    in_sync = frozenset(
        p for i in info.sync_state_set if i in by_id for p in [pod_of(by_id[i].address, pods)] if p
    )
    alive = frozenset(p for r in info.replicas if r.alive for p in [pod_of(r.address, pods)] if p)
    replicas = []
    for r in sorted(info.replicas, key=lambda r: r.broker_id):
        pod = pod_of(r.address, pods)
        if pod is None:
            continue
        replica: dict[str, Any] = {
            "pod": pod,
            "brokerId": r.broker_id,
            "alive": r.alive,
            "inSync": pod in in_sync,
            "lagBytes": max(0, master_offset - r.max_offset),
        }
        if r.zone:
            replica["zone"] = r.zone
        replicas.append(replica)
    view = GroupView(master_pod if info.master_id else None, info.master_epoch, in_sync, alive)
    status = {
        "master": master_pod or "",
        "epoch": info.master_epoch,
        "syncStateSet": sorted(in_sync),
        "inSyncReplicas": len(in_sync),
        "replicas": replicas,
    }
    return GroupReport(view, status)


def broker_id_of(info: pb.ReplicaInfo, pod: str, pods: Collection[str]) -> int | None:
    """The broker id the controller gave the replica running in `pod`."""
    for r in info.replicas:
        if pod_of(r.address, pods) == pod:
            return int(r.broker_id)
    return None
