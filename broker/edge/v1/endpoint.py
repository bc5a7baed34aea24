"""The capstan.v1 endpoints on the broker's gRPC server (Admin, Pull, Consumer, and the
replicas' Replication and ReplicaPeers), so the composition root names no capstan.v1 stub."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from capstan.broker.edge.forwarding import Forwarder
from capstan.broker.edge.late_binding import late_bound
from capstan.v1 import admin_pb2_grpc as admin_grpc
from capstan.v1 import consumer_pb2_grpc as consumer_grpc
from capstan.v1 import pull_pb2_grpc as pull_grpc
from capstan.v1 import replication_pb2_grpc as replication_grpc


@dataclass(frozen=True)
class V1Endpoints:
    """The late-bound servicer (late_binding.py) of each capstan.v1 service."""

    admin: Any
    pull: Any
    consumer: Any
    replication: Any
    peers: Any


def add_late_bound_v1(server: grpc.aio.Server) -> V1Endpoints:
    """Every capstan.v1 service of a broker on `server`, answering UNAVAILABLE until bound."""
    found = V1Endpoints(
        admin=late_bound(admin_grpc.AdminServicer),
        pull=late_bound(pull_grpc.PullServicer),
        consumer=late_bound(consumer_grpc.ConsumerServicer, frozenset({"WatchGroup"})),
        replication=late_bound(
            replication_grpc.ReplicationServicer, frozenset({"Replicate", "FetchCompacted"})
        ),
        peers=late_bound(replication_grpc.ReplicaPeersServicer),
    )
    admin_grpc.add_AdminServicer_to_server(found.admin, server)  # type: ignore[no-untyped-call]
    pull_grpc.add_PullServicer_to_server(found.pull, server)  # type: ignore[no-untyped-call]
    consumer_grpc.add_ConsumerServicer_to_server(found.consumer, server)  # type: ignore[no-untyped-call]
    replication_grpc.add_ReplicationServicer_to_server(found.replication, server)  # type: ignore[no-untyped-call]
    replication_grpc.add_ReplicaPeersServicer_to_server(found.peers, server)  # type: ignore[no-untyped-call]
    return found


def v1_forwarders() -> tuple[Forwarder, Forwarder, Forwarder]:
    """Forwarders to the master for Admin, Pull and Consumer."""
    return (
        Forwarder(admin_grpc.AdminStub),
        Forwarder(pull_grpc.PullStub),
        Forwarder(consumer_grpc.ConsumerStub),
    )
