"""Timing every call the broker serves, in one place: a gRPC server interceptor.

Each unary and server-streaming call of the messaging and capstan.v1 services is observed
in `rocketmq_rpc_latency` with its protocol (`grpc_v2`, `capstan_v1`), its method and its
response code: for v2 the code inside the answer's `status` (the first answer of a
stream), otherwise the gRPC status code's number. Health checks, reflection and the
replication streams are left out. The handlers themselves know nothing of it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from capstan.broker.metrics import BrokerMetrics

_PROTOCOLS = {
    "apache.rocketmq.v2.": "grpc_v2",
    "capstan.v1.Admin/": "capstan_v1",
    "capstan.v1.Pull/": "capstan_v1",
    "capstan.v1.Consumer/": "capstan_v1",
    "capstan.v1.ReplicaPeers/": "capstan_v1",
}


def _protocol(full_method: str) -> str | None:
    """`grpc_v2` or `capstan_v1` for a timed method (/service/Method), else None."""
    path = full_method.lstrip("/")
    for prefix, protocol in _PROTOCOLS.items():
        if path.startswith(prefix):
            return protocol
    return None


def _answer_code(response: Any) -> int:
    status = getattr(response, "status", None)
    return int(getattr(status, "code", 0))


def _call_code(context: grpc.aio.ServicerContext) -> int:
    """The gRPC code a call ended with (OK unless the handler set or aborted with one)."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return int(code.value[0])
    return int(code or 0)


class RpcTiming(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.request_streaming:
            return handler
        method: str = details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        protocol = _protocol(method)
        if protocol is None:
            return handler
        name = method.rsplit("/", 1)[-1]
        if handler.response_streaming:
            timed = grpc.unary_stream_rpc_method_handler(
                self._timed_stream(protocol, name, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        else:
            timed = grpc.unary_unary_rpc_method_handler(
                self._timed_unary(protocol, name, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        self._wrapped[method] = (handler, timed)
        return timed

    def _timed_unary(
        self, protocol: str, name: str, behaviour: Callable[[Any, Any], Awaitable[Any]]
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        observe = self._metrics.observe_rpc

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            try:
                response = await behaviour(request, context)
            except BaseException:
                observe(protocol, name, _call_code(context), time.perf_counter() - started)
                raise
            code = _answer_code(response) if protocol == "grpc_v2" else _call_code(context)
            observe(protocol, name, code, time.perf_counter() - started)
            return response

        return call

    def _timed_stream(
        self, protocol: str, name: str, behaviour: Callable[[Any, Any], AsyncIterator[Any]]
    ) -> Callable[[Any, Any], AsyncIterator[Any]]:
        observe = self._metrics.observe_rpc

        async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            started = time.perf_counter()
            code: int | None = None
            try:
                async for response in behaviour(request, context):
                    if code is None and protocol == "grpc_v2":
                        code = _answer_code(response)
                    yield response
            finally:
                if code is None:
                    code = _call_code(context)
                observe(protocol, name, code, time.perf_counter() - started)

        return call
