"""The controller's changes admitted only from the cluster's own processes.

With `auth.enabled`, RegisterBroker, BrokerHeartbeat, AlterSyncStateSet and ElectMaster
must be signed with the cluster's identity (`capstan.cluster` and the cluster's secret,
capstan/security/peers.py): a process without it cannot register as a broker, keep one
alive, change a SyncStateSet or move a master. GetReplicaInfo and GetClusterStatus stay
readable (they show the groups' shape and addresses, no data); the Admin and
MessagingService fronts pass each caller's own signature on to the brokers, which check it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import grpc

from capstan.common.log_limit import LimitedLog
from capstan.security.peers import CLUSTER_ACCESS_KEY
from capstan.security.signature import AuthenticationError, Failure, verify

log = logging.getLogger(__name__)

SERVICE = "capstan.v1.Controller"
READABLE = frozenset({"GetReplicaInfo", "GetClusterStatus"})
LOG_INTERVAL_S = 60.0
FORBIDDEN = "forbidden"
"""The refusal reason of a caller that signed rightly but is not the cluster."""
REFUSAL_REASONS = (*(failure.value for failure in Failure), FORBIDDEN)


class ClusterGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(
        self,
        cluster_secret: str | None,
        max_clock_skew_s: float,
        on_refusal: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """`cluster_secret` None: authentication is off and every call passes.
        `on_refusal` is told each refusal's reason (capstan_auth_failures_total's label)."""
        self._secret = cluster_secret
        self._skew_s = max_clock_skew_s
        self._log = LimitedLog(log, LOG_INTERVAL_S)
        self._on_refusal = on_refusal
        self.refused = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        service, _, name = details.method.lstrip("/").partition("/")
        if handler is None or self._secret is None or service != SERVICE or name in READABLE:
            return handler
        try:
            caller = verify(
                details.invocation_metadata or (),
                self._secret_of,
                datetime.now(UTC),
                self._skew_s,
            )
        except AuthenticationError as exc:
            reason = exc.failure.value
            return self._refusal(name, grpc.StatusCode.UNAUTHENTICATED, exc.detail, reason)
        if caller != CLUSTER_ACCESS_KEY:  # pragma: no cover - _secret_of knows no other
            denied = grpc.StatusCode.PERMISSION_DENIED
            return self._refusal(name, denied, "not the cluster", FORBIDDEN)
        return handler

    def _secret_of(self, access_key: str) -> str | None:
        return self._secret if access_key == CLUSTER_ACCESS_KEY else None

    def _refusal(
        self, name: str, code: grpc.StatusCode, detail: str, reason: str
    ) -> grpc.RpcMethodHandler:
        self.refused += 1
        self._on_refusal(reason)
        message = f"{name} is for the cluster's own processes: {detail}"
        self._log.note(
            name,
            lambda: log.warning("refused %s: %s", name, detail),
            f"calls to {name} refused",
        )

        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(code, message)

        return grpc.unary_unary_rpc_method_handler(refuse, request_deserializer=_ignore)


def _ignore(_: bytes) -> None:
    return None
