"""Requests a slave passes on to its master.

Under a controller a client may reach any replica of a group: routes list them all, and the
official client's channel sticks to whichever answers first (gRPC pick_first). A replica
that is not the master passes each call on to the master it follows, with the client's
metadata, and passes the answer back (with Capstan's own trailers), so a client never has
to know which replica leads; when the master dies, its channel falls over to a live
replica, which is the new master or forwards to it.

A forwarded call carries `x-capstan-forwarded`; it is always served where it lands, so two
replicas that briefly disagree about the master cannot pass a call back and forth.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from capstan.common.channel_pool import CHANNEL_OPTIONS
from capstan.security.peers import dial_for_client, passed_on_behalf

FORWARDED = "x-capstan-forwarded"
NOBODY_DETAIL = "the group's master is gone and no slave acts for it yet; retry shortly"
_PASSED_TRAILER_PREFIX = "x-capstan-"
"""The master's trailing metadata passed back to the client: Capstan's own."""


def was_forwarded(context: grpc.aio.ServicerContext) -> bool:
    return any(key == FORWARDED for key, _ in context.invocation_metadata() or ())


def _metadata(context: grpc.aio.ServicerContext) -> list[tuple[str, str | bytes]]:
    return [*passed_on_behalf(context), (FORWARDED, "1")]


class Forwarder:
    """Channels to masters for one service (`stub_type`, its generated stub)."""

    def __init__(self, stub_type: Callable[[grpc.aio.Channel], Any]) -> None:
        self._stub_type = stub_type
        self._stubs: dict[str, Any] = {}
        self._channels: list[grpc.aio.Channel] = []

    def _method(self, address: str, name: str) -> Any:
        stub = self._stubs.get(address)
        if stub is None:
            channel = dial_for_client(address, CHANNEL_OPTIONS)
            self._channels.append(channel)
            stub = self._stubs[address] = self._stub_type(channel)
        return getattr(stub, name)

    async def unary(
        self, address: str, name: str, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        call = self._method(address, name)(
            request, metadata=_metadata(context), timeout=context.time_remaining()
        )
        try:
            reply = await call
            trailing = await call.trailing_metadata()
        except grpc.aio.AioRpcError as exc:
            await _pass_error(exc, address, context)
        passed = [(k, v) for k, v in trailing or () if k.startswith(_PASSED_TRAILER_PREFIX)]
        if passed:  # e.g. the queue ids a send was stored in
            context.set_trailing_metadata(passed)
        return reply

    async def stream(
        self, address: str, name: str, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        """A server-streaming call, or (when `request` is an async iterator) a
        bidirectional one."""
        call = self._method(address, name)(
            request, metadata=_metadata(context), timeout=context.time_remaining()
        )
        try:
            async for item in call:
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


async def _pass_error(
    exc: grpc.aio.AioRpcError, address: str, context: grpc.aio.ServicerContext
) -> None:
    code = exc.code()
    if code is grpc.StatusCode.UNAVAILABLE:
        details = f"the master at {address} cannot be reached: {exc.details()}"
    else:
        details = exc.details() or code.name
    await context.abort(code, details)
