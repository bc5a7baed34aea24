"""Requests a slave passes on to its master.

Under a controller a client may reach any replica of a group: routes list them all, and the
official client's channel sticks to whichever answers first (gRPC pick_first). A replica
that is not the master passes each call on to the master it follows, with the client's
metadata, and passes the answer back (with Capstan's own trailers), so a client never has
to know which replica leads; when the master dies, its channel falls over to a live
replica, which is the new master or forwards to it.

A forwarded call carries `x-capstan-forwarded`; it is always served where it lands, so two
replicas that briefly disagree about the master cannot pass a call back and forth.

A call passed on to a master that stops answering (SIGSTOP, a hung host: its connections
stay open) would wait there until the client's deadline. While one is out, the forwarder
looks whether this replica still names that master at each of this replica's role changes
(`moves`) and every `MOVE_CHECK_S` besides (an acting slave's duty moves without one); once
the group's leadership has moved (this replica leads now, or follows another), it cancels
the call
(`MasterMoved`): a unary call is then passed to the new master or served here, a stream
ends UNAVAILABLE for the client to open again. A unary call to a master whose port refuses
(killed) waits to be sent (gRPC's wait-for-ready) the same way, instead of failing a
client that may not retry it; one that fails after it was sent is answered as it failed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from capstan.broker.group_masters import OLDER_ITEMS_FOR
from capstan.common.channel_pool import CHANNEL_OPTIONS
from capstan.security.peers import dial_for_client, passed_on_behalf

FORWARDED = "x-capstan-forwarded"
MOVE_CHECK_S = 0.2
MOVED_DETAIL = "the group's master moved while the call was passed on to it; retry"
NOBODY_DETAIL = "the group's master is gone and no slave acts for it yet; retry shortly"
_PASSED_TRAILER_PREFIX = "x-capstan-"
"""The master's trailing metadata passed back to the client: Capstan's own."""


Moves = Callable[[], Awaitable[None]]
"""Returns at this replica's next role change."""


class MasterMoved(Exception):
    """The master a call was passed on to is no longer this replica's master."""


def was_forwarded(context: grpc.aio.ServicerContext) -> bool:
    return any(key == FORWARDED for key, _ in context.invocation_metadata() or ())


def older_items_for(context: grpc.aio.ServicerContext) -> str | None:
    """The leading group a call is made for (group_masters.OLDER_ITEMS_FOR); None for a
    client's own."""
    for key, value in context.invocation_metadata() or ():
        if key == OLDER_ITEMS_FOR:
            return str(value)
    return None


def _metadata(context: grpc.aio.ServicerContext) -> list[tuple[str, str | bytes]]:
    return [*passed_on_behalf(context), (FORWARDED, "1")]


class Forwarder:
    """Channels to masters for one service (`stub_type`, its generated stub)."""

    def __init__(self, stub_type: Callable[[grpc.aio.Channel], Any]) -> None:
        self._stub_type = stub_type
        self._stubs: dict[str, Any] = {}
        self._channels: list[grpc.aio.Channel] = []

    def _call(
        self,
        address: str,
        name: str,
        request: Any,
        context: grpc.aio.ServicerContext,
        marks: Sequence[tuple[str, str]] = (),
        wait_for_ready: bool = False,
    ) -> Any:
        """The call `name` to the master at `address`, with the client's metadata (and
        `marks`) and what is left of its deadline."""
        stub = self._stubs.get(address)
        if stub is None:
            channel = dial_for_client(address, CHANNEL_OPTIONS)
            self._channels.append(channel)
            stub = self._stubs[address] = self._stub_type(channel)
        method = getattr(stub, name)
        metadata = [*_metadata(context), *marks]
        return method(
            request,
            metadata=metadata,
            timeout=context.time_remaining(),
            wait_for_ready=wait_for_ready,
        )

    async def unary(
        self,
        address: str,
        name: str,
        request: Any,
        context: grpc.aio.ServicerContext,
        moved: Callable[[], bool] | None = None,
        marks: Sequence[tuple[str, str]] = (),
        moves: Moves | None = None,
    ) -> Any:
        """The master's answer; MasterMoved once `moved()` says it is no longer the master
        (the call to it cancelled). `marks` go along with the client's metadata. With
        `moved`, a call the master cannot take yet (its port refuses: killed) waits to be
        sent until it can or the leadership moves, rather than failing at once: it was
        never sent, so it goes to the new master as it is. A call that fails once sent is
        never sent again here (its answer was lost; the client decides)."""
        call = self._call(address, name, request, context, marks, wait_for_ready=moved is not None)
        try:
            await _until_done_or_moved(call, moved or _never, moves)
            reply = await call
            trailing = await call.trailing_metadata()
        except grpc.aio.AioRpcError as exc:
            await _pass_error(exc, address, context)
        passed = [(k, v) for k, v in trailing or () if k.startswith(_PASSED_TRAILER_PREFIX)]
        if passed:  # e.g. the queue ids a send was stored in
            context.set_trailing_metadata(passed)
        return reply

    async def stream(
        self,
        address: str,
        name: str,
        request: Any,
        context: grpc.aio.ServicerContext,
        moved: Callable[[], bool] = lambda: False,
        moves: Moves | None = None,
    ) -> AsyncIterator[Any]:
        """A server-streaming call, or (when `request` is an async iterator) a
        bidirectional one; ended UNAVAILABLE once `moved()` says the master moved."""
        call = self._call(address, name, request, context)
        items = aiter(call)
        try:
            while True:
                step = asyncio.ensure_future(anext(items))
                try:
                    await _until_done_or_moved(step, moved, moves)
                except MasterMoved:  # the step is cancelled already
                    await context.abort(grpc.StatusCode.UNAVAILABLE, MOVED_DETAIL)
                try:
                    item = step.result()
                except StopAsyncIteration:
                    return
                yield item
        except grpc.aio.AioRpcError as exc:
            await _pass_error(exc, address, context)
        finally:
            call.cancel()

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        self._stubs.clear()


async def _until_done_or_moved(
    call: Any, moved: Callable[[], bool], moves: Moves | None = None
) -> None:
    """Return once `call` (a gRPC call, or a future of a stream's next item) is done,
    whatever its outcome (the caller reads it from `call`); cancel it and raise
    MasterMoved if `moved()` turns true first, as looked at each time `moves()` returns
    and every MOVE_CHECK_S."""
    waiter = asyncio.ensure_future(_settled(call))
    watch: asyncio.Future[None] | None = None
    try:
        while True:
            if moves is not None and (watch is None or watch.done()):
                watch = asyncio.ensure_future(moves())  # one at a time, anew after each change
            awaited = [waiter] if watch is None else [waiter, watch]
            await asyncio.wait(awaited, timeout=MOVE_CHECK_S, return_when=asyncio.FIRST_COMPLETED)
            if waiter.done():
                return
            if moved():
                call.cancel()
                raise MasterMoved
    finally:
        waiter.cancel()
        if watch is not None:
            watch.cancel()


def _never() -> bool:
    return False


async def _settled(call: Any) -> None:
    with contextlib.suppress(Exception):  # StopAsyncIteration, AioRpcError: read from call
        await call


async def _pass_error(
    exc: grpc.aio.AioRpcError, address: str, context: grpc.aio.ServicerContext
) -> None:
    code = exc.code()
    if code is grpc.StatusCode.UNAVAILABLE:
        details = f"the master at {address} cannot be reached: {exc.details()}"
    else:
        details = exc.details() or code.name
    await context.abort(code, details)
