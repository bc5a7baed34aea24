"""The v2 endpoint on the broker's gRPC server, so the composition root names no v2 stub."""

from __future__ import annotations

from typing import Any

import grpc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.broker.edge.forwarding import Forwarder
from capstan.broker.edge.late_binding import late_bound

_STREAMING = frozenset({"ReceiveMessage", "PullMessage", "Telemetry"})


def add_late_bound_messaging(server: grpc.aio.Server) -> Any:
    """A MessagingService on `server` that answers UNAVAILABLE until a MessagingServicer is
    bound to it (late_binding.py)."""
    servicer = late_bound(svc_grpc.MessagingServiceServicer, _STREAMING)
    svc_grpc.add_MessagingServiceServicer_to_server(servicer, server)
    return servicer


def messaging_forwarder() -> Forwarder:
    return Forwarder(svc_grpc.MessagingServiceStub)
