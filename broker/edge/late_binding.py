"""gRPC servicers that exist before the broker does.

grpc.aio needs every service registered before the server starts, but the broker wants to
answer health checks while its store recovers. A late-bound servicer is registered at
start and answers UNAVAILABLE until the real servicer is bound to it. Bound with a `forward_to`, it
passes calls on to the group's master while this broker is not it (forwarding.py); a unary
call out to a master that stops being it is passed to the new one, or served here. An RPC
the bound servicer does not implement is answered UNIMPLEMENTED here, naming the method,
before any forwarding (the master would refuse it all the same).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from capstan.broker.edge.forwarding import (
    NOBODY_DETAIL,
    Forwarder,
    MasterMoved,
    Moves,
    was_forwarded,
)
from capstan.broker.replication.acting_master import NOBODY
from capstan.common.grpc_services import service_name, unserved_detail, unserved_methods

NOT_READY = "the broker is starting (store recovery); retry shortly"
UNSERVED_BY = "Capstan brokers"


def late_bound(base: type, streaming: frozenset[str] = frozenset()) -> Any:
    """An instance of a subclass of servicer `base` whose RPCs forward to `.bind(target)`."""

    def unary(name: str) -> Any:
        async def call(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            if self._target is None or name in self._unserved:
                await self._refuse(name, context)
            address = await self._forward_address(name, context)
            while address:  # again when the master moved while the call was out
                try:
                    return await self._forwarder.unary(
                        address,
                        name,
                        request,
                        context,
                        self._moved_from(address),
                        moves=self._moves,
                    )
                except MasterMoved:
                    address = await self._forward_address(name, context)
            return await getattr(self._target, name)(request, context)

        return call

    def stream(name: str) -> Any:
        async def call(
            self: Any, request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            if self._target is None or name in self._unserved:
                await self._refuse(name, context)
            address = await self._forward_address(name, context)
            calls = (
                self._forwarder.stream(
                    address, name, request, context, self._moved_from(address), self._moves
                )
                if address
                else getattr(self._target, name)(request, context)
            )
            async for item in calls:
                yield item

        return call

    names = [n for n in vars(base) if not n.startswith("_") and callable(getattr(base, n))]
    namespace: dict[str, Any] = {n: stream(n) if n in streaming else unary(n) for n in names}

    def bind(
        self: Any,
        target: Any,
        forward_to: Callable[[], str] | None = None,
        forwarder: Forwarder | None = None,
        local: frozenset[str] = frozenset(),
        settled: Callable[[], Awaitable[None]] | None = None,
        moves: Moves | None = None,
    ) -> None:
        """Serve with `target`; with `forward_to`, pass every call but those named in
        `local` on to the address it returns (the master) whenever it returns one, after
        `settled()` returns (it waits while the leadership moves); a call out to the
        master looks again where to go each time `moves()` returns (a role change)."""
        self._target = target
        service = service_name(base)
        self._unserved = {
            name: unserved_detail(service, name, UNSERVED_BY)
            for name in unserved_methods(type(target), base)
        }
        self._forward_to = forward_to
        self._forwarder = forwarder
        self._local = local
        self._settled = settled
        self._moves = moves

    async def refuse(self: Any, name: str, context: grpc.aio.ServicerContext) -> None:
        """UNAVAILABLE until bound; UNIMPLEMENTED for an RPC the target leaves to `base`."""
        if self._target is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, NOT_READY)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, self._unserved[name])

    async def forward_address(self: Any, name: str, context: grpc.aio.ServicerContext) -> str:
        """Where to pass the call on to, "" to serve it here; UNAVAILABLE while nobody
        serves the group's master duties."""
        if self._forward_to is None or name in self._local:
            return ""
        if self._settled is not None:
            await self._settled()
        address = str(self._forward_to())  # "" on the master: its calls are not scanned
        if not address or was_forwarded(context):
            return ""
        if address == NOBODY:
            await context.abort(grpc.StatusCode.UNAVAILABLE, NOBODY_DETAIL)
        return address

    def moved_from(self: Any, address: str) -> Callable[[], bool]:
        """Whether this replica no longer passes calls on to `address` (it leads now, or
        follows another master)."""
        return lambda: str(self._forward_to()) != address

    namespace["bind"] = bind
    namespace["_moved_from"] = moved_from
    namespace["_forward_address"] = forward_address
    namespace["_refuse"] = refuse
    namespace["_unserved"] = {}
    namespace["_target"] = None
    namespace["_forward_to"] = None
    namespace["_settled"] = None
    namespace["_moves"] = None
    return type(f"LateBound{base.__name__}", (base,), namespace)()
