"""gRPC servicers that exist before the broker does.

grpc.aio needs every service registered before the server starts, but the broker wants to
answer health checks while its store recovers. A late-bound servicer is registered at
start and answers UNAVAILABLE until the real servicer is bound to it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

NOT_READY = "the broker is starting (store recovery); retry shortly"


def late_bound(base: type, streaming: frozenset[str] = frozenset()) -> Any:
    """An instance of a subclass of servicer `base` whose RPCs forward to `.bind(target)`."""

    def unary(name: str) -> Any:
        async def call(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            if self._target is None:
                await context.abort(grpc.StatusCode.UNAVAILABLE, NOT_READY)
            return await getattr(self._target, name)(request, context)

        return call

    def stream(name: str) -> Any:
        async def call(
            self: Any, request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            if self._target is None:
                await context.abort(grpc.StatusCode.UNAVAILABLE, NOT_READY)
            async for item in getattr(self._target, name)(request, context):
                yield item

        return call

    names = [n for n in vars(base) if not n.startswith("_") and callable(getattr(base, n))]
    namespace: dict[str, Any] = {n: stream(n) if n in streaming else unary(n) for n in names}

    def bind(self: Any, target: Any) -> None:
        self._target = target

    namespace["bind"] = bind
    namespace["_target"] = None
    return type(f"LateBound{base.__name__}", (base,), namespace)()
