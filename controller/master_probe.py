"""A quick look at a master that one of its slaves found gone: does it still answer?

A slave whose replication stream broke (refused or reset) says so in its next heartbeat;
the controller then asks the master's gRPC health service, over the cluster's own channel
(TLS when the cluster has it), with a deadline. Only a definite answer that it is gone
lets the controller elect at once, rather than when the master's heartbeats lapse
(`broker_timeout_ms`): the connection refused or reset (UNAVAILABLE: the process is gone)
or NOT_SERVING (it is stopping). No answer in time proves nothing on a loaded machine by
itself: the controller elects then only if the master's own heartbeats have also stopped
for `silent_master_ms` (a stopped or hung process); a slave cut off from a master that
still serves and beats is left to the heartbeats.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capstan.security.peers import dial_peer

PROBE_TIMEOUT_S = 0.5
"""A live master answers a health check in milliseconds; a gone one is refused at once, a
stopped one never. Well within the reporting slave's heartbeat call (2 s at the default
1 s interval), with the wait for a silent master's heartbeats to age."""

GONE = frozenset({"UNAVAILABLE", "NOT_SERVING"})
"""The answers that count the master as gone."""


async def master_answer(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """`SERVING` when the broker at `address` says so within `timeout_s`; else what it
    said (`NOT_SERVING`) or why there was no answer (a status code's name)."""
    try:
        async with dial_peer(address, []) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
    except grpc.aio.AioRpcError as exc:
        return str(exc.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
