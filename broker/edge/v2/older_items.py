"""A static topic's messages handed out by a group other than the one that keeps them.

When a logic queue moves, its earlier items stay on the groups that held it (issue 31),
and routes name the queue on the group that fronts it now alone. A receive there also
serves what its consumer group has not consumed of those items, as RocketMQ's broker reads
older items through the mapping: the master first asks each group that keeps an older item
of a queue it fronts (`StaticView.older_groups`) to hand out messages of the queues both
hold, as the client would (its metadata passed on), at once (`OLDER_ITEMS_FOR` names the
asking group). The other way round, a group keeping older items, reached by a client whose
route predates the move, asks the fronting groups (`StaticView.newer_groups`) once it has
nothing of its own to give. The messages go to the client with receipt handles that name
the group they came from (`wrap`); an ack, a changed invisible time or a dead-lettering of
such a handle is passed to that group, which checks the handle it made.

A group that answered nothing is asked again `LOOK_EVERY_S` later (a message handed out
there and not acknowledged comes due again); one that failed or took longer than
`LOOK_TIMEOUT_S` is left alone for `PAUSE_S`, so a group that is down costs a receive at
most one short wait. A look that outlasts `LOOK_TIMEOUT_S` is not cut off: the group has
handed its messages out once it answers, so the call goes on (up to `LATE_ANSWER_S`) and
what it brings is kept for the consumer group's next receive here, while at least half its
invisible time is left; the group is not asked again until then. A slow group (a loaded
machine) delays its older items by a receive, never by their invisible time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.broker.edge.v2.codes import RequestError
from capstan.broker.group_masters import OLDER_ITEMS_FOR, GroupMasters
from capstan.common.channel_pool import ChannelPool
from capstan.security.peers import dial_for_client, passed_on_behalf

log = logging.getLogger(__name__)

HANDLE_PREFIX = "o1~"
LOOK_TIMEOUT_S = 1.0
"""A group's time to answer a receive for older items."""
LOOK_EVERY_S = 0.25
"""A group that had nothing for a consumer group is asked again this much later: a receive
reached through a route from before a move waits about this long for a message sent to the
queue's new group (at 1 s, the official FIFO consumer's receives across remaps waited 1.1 s
here and 2.04 s in CI with a message stored for them). One quick call each time, per
consumer group and topic, and only while a receive waits."""
PAUSE_S = 0.5
"""A group that failed a receive (no master found, or the call failed: its master moving,
a remap under way) is not asked for this long: enough not to ask a group that is down at
every turn, short enough that a receive waiting for a moved queue's older items there is
not held for seconds (at 2 s, the official FIFO consumer's receives across remaps took
2.07-2.32 s in three CI runs of
`test_the_official_fifo_consumer_reads_queues_moved_back_and_forth_without_a_stall`)."""
MASTER_WAIT_S = 2.0
"""How long an ack (or a change of invisible time) waits for the other group to have a
master again."""
MASTER_POLL_S = 0.2
CALL_TIMEOUT_S = 3.0
"""The longest an ack, a change of invisible time or a dead-lettering passed on waits."""
LATE_ANSWER_S = 10.0
"""How long a look that outlasted LOOK_TIMEOUT_S may still take."""

Look = tuple[str, str, str, str]
"""(the group asked, the consumer group, the topic, the filter expression)."""


@dataclass
class _LateAnswer:
    """A look still under way, or its answer not yet handed to a receive."""

    call: asyncio.Task[list[svc.ReceiveMessageResponse] | None]
    keep_until: float
    """Monotonic: past it the messages are too near their invisible time to hand out."""


def wrap(group: str, handle: str) -> str:
    """A receipt handle of group `group` as this group hands it to the client."""
    return f"{HANDLE_PREFIX}{group}~{handle}"


def unwrap(handle: str) -> tuple[str, str] | None:
    """(the group, its own handle) of a handle `wrap` made; None for any other handle."""
    if not handle.startswith(HANDLE_PREFIX):
        return None
    group, sep, inner = handle[len(HANDLE_PREFIX) :].rpartition("~")
    if not sep or not group or not inner:
        return None
    return group, inner


class OlderItems:
    """Use from the broker's event loop only."""

    def __init__(self, masters: GroupMasters, own_group: str) -> None:
        self._masters = masters
        self._own = own_group
        self._channels = ChannelPool(dial_for_client)
        self._next_look: dict[tuple[str, str, str], float] = {}
        self._paused: dict[str, float] = {}
        self._late: dict[Look, _LateAnswer] = {}

    async def close(self) -> None:
        for late in self._late.values():
            late.call.cancel()
        self._late.clear()
        await self._channels.close()

    def next_look_s(self, groups: Sequence[str], consumer_group: str, topic: str) -> float:
        """Seconds until one of `groups` is to be asked again for the consumer group."""
        now = time.monotonic()
        soonest = min(self._due(g, consumer_group, topic) for g in groups)
        return max(0.0, soonest - now)

    def _due(self, group: str, consumer_group: str, topic: str) -> float:
        return max(
            self._next_look.get((group, consumer_group, topic), 0.0), self._paused.get(group, 0.0)
        )

    async def receive(
        self,
        groups: Sequence[str],
        request: svc.ReceiveMessageRequest,
        context: grpc.aio.ServicerContext,
    ) -> list[svc.ReceiveMessageResponse]:
        """The message answers of the first of `groups` (due to be asked) that hands out
        any, their receipt handles wrapped; empty when none does."""
        consumer_group, topic = request.group.name, request.message_queue.topic.name
        expression = request.filter_expression.expression
        for group in groups:
            look = (group, consumer_group, topic, expression)
            late = self._late.get(look)
            if late is not None:
                if not late.call.done():
                    continue  # asked already: its answer is for a later receive
                del self._late[look]
                kept = _result(late.call)
                if kept and time.monotonic() < late.keep_until:
                    return kept
            if self._due(group, consumer_group, topic) > time.monotonic():
                continue
            found = await self._look(look, request, context)
            if found is None:
                self._paused[group] = time.monotonic() + PAUSE_S
                continue
            if not found:
                self._next_look[(group, consumer_group, topic)] = time.monotonic() + LOOK_EVERY_S
                continue
            self._next_look.pop((group, consumer_group, topic), None)
            return found
        return []

    async def _look(
        self, look: Look, request: svc.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> list[svc.ReceiveMessageResponse] | None:
        """`_receive_from` the group, waited for up to LOOK_TIMEOUT_S (within the client's
        deadline); None past it, the call kept going for a later receive."""
        started = time.monotonic()
        # What the call to the group carries is taken from `context` now: the call may be
        # kept past the client's (a late answer), and a ServicerContext read once its RPC
        # has ended is freed memory (grpc's peer() there crashed a broker with SIGSEGV).
        metadata = [*passed_on_behalf(context), (OLDER_ITEMS_FOR, self._own)]
        call = asyncio.ensure_future(self._receive_from(look[0], request, metadata))
        try:
            return await asyncio.wait_for(asyncio.shield(call), _timeout(context))
        except TimeoutError:
            invisible_s = request.invisible_duration.ToMilliseconds() / 1000
            self._late[look] = _LateAnswer(call, started + invisible_s / 2)
            log.info(
                "older items of %s on group %s: no answer within %.1f s, kept for later",
                look[2],
                look[0],
                LOOK_TIMEOUT_S,
            )
            return None
        except asyncio.CancelledError:  # the client went: the answer may still come
            invisible_s = request.invisible_duration.ToMilliseconds() / 1000
            self._late[look] = _LateAnswer(call, started + invisible_s / 2)
            raise

    async def _receive_from(
        self,
        group: str,
        request: svc.ReceiveMessageRequest,
        metadata: list[tuple[str, Any]],
    ) -> list[svc.ReceiveMessageResponse] | None:
        """`group`'s message answers (handles wrapped), asked with `metadata`; None when it
        could not be asked. It never reads the client's ServicerContext: it may outlive
        the client's call."""
        address = await self._masters.address(group)
        if not address:
            return None
        stub = svc_grpc.MessagingServiceStub(self._channels.get(address))
        try:
            call = stub.ReceiveMessage(request, metadata=metadata, timeout=LATE_ANSWER_S)
            answers = [answer async for answer in call]
        except grpc.aio.AioRpcError as exc:
            log.info(
                "older items of %s on group %s: %s",
                request.message_queue.topic.name,
                group,
                exc.code().name,
            )
            self._masters.forget(group)
            return None
        found = [a for a in answers if a.WhichOneof("content") == "message"]
        for answer in found:
            properties = answer.message.system_properties
            properties.receipt_handle = wrap(group, properties.receipt_handle)
        return found

    # -- what the client does with a handle of another group ----------------------------

    async def ack(
        self,
        group: str,
        request: svc.AckMessageRequest,
        entries: Sequence[svc.AckMessageEntry],
        context: grpc.aio.ServicerContext,
    ) -> list[svc.AckMessageResultEntry]:
        """`group`'s answers to acks of `entries` (their handles wrapped), in their order."""
        passed = svc.AckMessageRequest(
            group=request.group, topic=request.topic, entries=[_with_inner(e) for e in entries]
        )
        try:
            reply = await self._call(group, "AckMessage", passed, context)
        except RequestError as exc:
            return [_ack_result(e, exc.status()) for e in entries]
        answered = list(reply.entries)
        out = []
        for i, entry in enumerate(entries):
            if i < len(answered):  # each answer names the handle it was sent: this group's
                answered[i].receipt_handle = entry.receipt_handle
                out.append(answered[i])
            else:  # an answer with fewer entries than asked
                out.append(_ack_result(entry, reply.status))
        return out

    async def change_invisible(
        self,
        group: str,
        request: svc.ChangeInvisibleDurationRequest,
        context: grpc.aio.ServicerContext,
    ) -> svc.ChangeInvisibleDurationResponse:
        reply = await self._call(group, "ChangeInvisibleDuration", _with_inner(request), context)
        if reply.receipt_handle:
            reply.receipt_handle = wrap(group, reply.receipt_handle)
        return reply

    async def forward_to_dlq(
        self,
        group: str,
        request: svc.ForwardMessageToDeadLetterQueueRequest,
        context: grpc.aio.ServicerContext,
    ) -> svc.ForwardMessageToDeadLetterQueueResponse:
        return await self._call(
            group, "ForwardMessageToDeadLetterQueue", _with_inner(request), context
        )

    async def _master_soon(self, group: str, context: grpc.aio.ServicerContext) -> str:
        """`group`'s master address, waiting up to MASTER_WAIT_S (within the client's
        deadline) while it has none: an ack met mid-failover goes to the new master rather
        than fail, and the message comes again to nobody."""
        remaining = context.time_remaining()
        limit = MASTER_WAIT_S if remaining is None else min(MASTER_WAIT_S, remaining - 0.5)
        deadline = time.monotonic() + limit
        while True:
            address = await self._masters.address(group)
            if address or time.monotonic() + MASTER_POLL_S > deadline:
                return address
            await asyncio.sleep(MASTER_POLL_S)

    async def _call(
        self, group: str, name: str, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        """`group`'s answer to `name`; RequestError when the group cannot be reached."""
        if group == self._own:
            raise RequestError(pb.INVALID_RECEIPT_HANDLE, "the receipt handle names this group")
        address = await self._master_soon(group, context)
        if not address:
            raise RequestError(
                pb.INTERNAL_SERVER_ERROR,
                f"the message came from group {group!r}, which has no master this broker "
                "can find now; retry shortly",
            )
        stub = svc_grpc.MessagingServiceStub(self._channels.get(address))
        timeout = min(CALL_TIMEOUT_S, context.time_remaining() or CALL_TIMEOUT_S)
        try:
            return await getattr(stub, name)(
                request, metadata=passed_on_behalf(context), timeout=timeout
            )
        except grpc.aio.AioRpcError as exc:
            self._masters.forget(group)
            raise RequestError(
                pb.PROXY_TIMEOUT
                if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED
                else pb.INTERNAL_SERVER_ERROR,
                f"group {group!r}, where the message came from, did not answer: "
                f"{exc.code().name}; retry shortly",
            ) from None


def _ack_result(entry: svc.AckMessageEntry, status: pb.Status) -> svc.AckMessageResultEntry:
    return svc.AckMessageResultEntry(
        message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=status
    )


def _with_inner(message: Any) -> Any:
    """A copy of `message` (an ack entry, a request) with its group's own receipt handle."""
    found = unwrap(message.receipt_handle)
    assert found is not None  # callers pass wrapped handles only
    passed = type(message)()
    passed.CopyFrom(message)
    passed.receipt_handle = found[1]
    return passed


def _result(
    call: asyncio.Task[list[svc.ReceiveMessageResponse] | None],
) -> list[svc.ReceiveMessageResponse] | None:
    """A finished look's answers; None when it failed or was cancelled."""
    if call.cancelled() or call.exception() is not None:
        return None
    return call.result()


def _timeout(context: grpc.aio.ServicerContext) -> float:
    remaining = context.time_remaining()
    return LOOK_TIMEOUT_S if remaining is None else max(0.05, min(LOOK_TIMEOUT_S, remaining))
