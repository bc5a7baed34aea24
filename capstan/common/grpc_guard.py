"""Hostile and broken calls answered with a status, not a traceback: a gRPC server
interceptor on every Capstan server, over every method of every service it registers.

- A request that does not parse as its type (random bytes, a message cut short) answers
  INVALID_ARGUMENT. grpc.aio deserializes before the handler runs and logs a failure there
  with a traceback, per call, answering UNKNOWN; here the deserializer hands the handler a
  marker instead, and the guard refuses the call. In a request stream, the first message
  that does not parse ends the call the same way.
- A handler that raises NotImplementedError (what generated servicer bases do for a method
  nobody implemented, e.g. grpcio-health's List) answers UNIMPLEMENTED, naming the method.
- A handler that could not write for a full disk (ENOSPC, a quota) answers
  RESOURCE_EXHAUSTED, saying so in words (disk_full.py), with no traceback.
- Any other exception a handler lets escape answers INTERNAL; its traceback is logged the
  first time its type escapes that method, later ones in one line.

Refusals and failures are logged through LimitedLog: one line per method a minute, with
the count of the rest. A payload over the server's receive limit never reaches Python:
gRPC itself answers RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from capstan.common.disk_full import disk_full_detail, is_disk_full
from capstan.common.grpc_services import unserved_detail
from capstan.common.log_limit import LimitedLog, Schedule

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 60.0
"""In seconds: at most one line per method and interval for refused or failed calls."""

Behaviour = Callable[[Any, grpc.aio.ServicerContext], Any]


@dataclass(frozen=True, slots=True)
class Malformed:
    """What the handler gets instead of a request that did not parse."""

    reason: str


class MalformedRequest(Exception):
    """Raised from a request stream at a message that did not parse."""


def tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """`deserialize`, returning a Malformed marker where it would raise DecodeError."""
    if deserialize is None:
        return None

    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as exc:
            return Malformed(str(exc) or "the bytes do not parse")

    return decode


class _CheckedRequests:
    """A request stream that raises MalformedRequest at a message that did not parse and
    remembers it, in case the handler swallows the exception."""

    def __init__(self, requests: AsyncIterator[Any]) -> None:
        self._requests = requests
        self.malformed: Malformed | None = None

    def __aiter__(self) -> _CheckedRequests:
        return self

    async def __anext__(self) -> Any:
        request = await anext(self._requests)
        if isinstance(request, Malformed):
            self.malformed = request
            raise MalformedRequest(request.reason)
        return request


class RequestGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(
        self, where: str, interval_s: float = LOG_INTERVAL_S, schedule: Schedule | None = None
    ) -> None:
        """`where` names the server in UNIMPLEMENTED answers ("Capstan brokers")."""
        extra = {} if schedule is None else {"schedule": schedule}
        self._where = where
        self._interval_s = interval_s
        self._refusals = LimitedLog(log, interval_s, **extra)
        self._failures = LimitedLog(log, interval_s, **extra)
        self._traced: set[tuple[str, str]] = set()
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return None
        method: str = details.method.lstrip("/")
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        guarded = self._guarded(method, handler)
        self._wrapped[method] = (handler, guarded)
        return guarded

    def _guarded(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        codecs = {
            "request_deserializer": tolerant(handler.request_deserializer),
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary), **codecs
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(method, handler.unary_stream), **codecs
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(method, handler.stream_unary, streamed=True), **codecs
            )
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(method, handler.stream_stream, streamed=True), **codecs
        )

    def _unary(self, method: str, behaviour: Behaviour, streamed: bool = False) -> Behaviour:
        """A handler answering once, guarded; `streamed` when its requests are a stream."""

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            request = await self._checked(method, request, context, streamed)
            try:
                response = await behaviour(request, context)
            except grpc.aio.BaseError:  # an abort, a client gone: grpc's own business
                raise
            except Exception as exc:  # noqa: BLE001 - the guard's purpose
                await self._failed(method, request, exc, context)
            await self._after(method, request, context)
            return response

        return call

    def _streaming(self, method: str, behaviour: Behaviour, streamed: bool = False) -> Behaviour:
        """A handler answering with a stream (an async generator, or a coroutine writing
        with context.write), guarded; `streamed` when its requests are a stream."""
        if inspect.iscoroutinefunction(behaviour):
            return self._unary(method, behaviour, streamed)

        async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            request = await self._checked(method, request, context, streamed)
            try:
                async for response in behaviour(request, context):
                    yield response
            except grpc.aio.BaseError:
                raise
            except Exception as exc:  # noqa: BLE001 - the guard's purpose
                await self._failed(method, request, exc, context)
            await self._after(method, request, context)

        return call

    async def _checked(
        self, method: str, request: Any, context: grpc.aio.ServicerContext, streamed: bool
    ) -> Any:
        if streamed:
            return _CheckedRequests(request)
        if isinstance(request, Malformed):
            await self._refuse(method, request, context)
        return request

    async def _after(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        """A request stream's handler that swallowed MalformedRequest and ended is refused
        all the same."""
        if isinstance(request, _CheckedRequests) and request.malformed is not None:
            await self._refuse(method, request.malformed, context)

    async def _failed(
        self, method: str, request: Any, exc: Exception, context: grpc.aio.ServicerContext
    ) -> None:
        if isinstance(request, _CheckedRequests) and request.malformed is not None:
            await self._refuse(method, request.malformed, context)
        service, _, name = method.partition("/")
        if isinstance(exc, NotImplementedError):
            detail = unserved_detail(service, name, self._where)
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, detail)
        if isinstance(exc, OSError) and is_disk_full(exc):
            await self._disk_full(method, exc, context)
        kind = type(exc).__name__
        self._failures.note(method, lambda: self._log_failure(method, exc), f"failures of {method}")
        await context.abort(grpc.StatusCode.INTERNAL, f"{method} failed: {kind}: {exc}")

    async def _disk_full(
        self, method: str, exc: OSError, context: grpc.aio.ServicerContext
    ) -> None:
        self._failures.note(
            f"{method} disk full",
            lambda: log.error("%s refused: the disk is full (%s)", method, exc.strerror),
            f"calls to {method} refused for a full disk",
        )
        detail = disk_full_detail("this call's changes", exc)
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, detail)

    def _log_failure(self, method: str, exc: Exception) -> None:
        seen = (method, type(exc).__name__)
        if seen in self._traced:
            log.error("%s failed: %s: %s (traceback logged before)", method, seen[1], exc)
            return
        self._traced.add(seen)
        log.error("%s failed: %s: %s", method, seen[1], exc, exc_info=exc)

    async def _refuse(
        self, method: str, malformed: Malformed, context: grpc.aio.ServicerContext
    ) -> None:
        self._refusals.note(
            method,
            lambda: log.warning(
                "refused a request to %s that does not parse (%s); more are counted, one "
                "line each %.0f s",
                method,
                malformed.reason,
                self._interval_s,
            ),
            f"malformed requests to {method} refused",
        )
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the request does not parse as the input of {method}: {malformed.reason}",
        )
