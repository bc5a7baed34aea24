"""Where the messages a broker stores by itself go when their topic is static: a delayed
message coming due, a transaction committed (the timer's and the transactions' put).

Such a message was given a logic queue when it was sent, and that queue may have moved to
another group since. A message of a logic queue this group still leads is stored here as
usual. One whose queue another group leads goes to a logic queue this group does lead (a
delayed or transactional message promises no order, so any of the topic's queues will
do). When this group leads none of the topic's queues any more (it was drained), the
messages go to the group that leads their queue now, as the cluster
(`Admin.PlaceMessages`), which stores them in a queue it leads. A queue between the two
steps of a move takes nothing for a moment: the put fails and its caller retries, as it
does for any failed put. A message stored elsewhere and then here in one put, where the
local part fails, is stored elsewhere again on the retry (at least once, as ever).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import grpc

from capstan.broker.group_links import GroupLinks, NoMaster
from capstan.broker.static_topics import StaticTopics
from capstan.broker.store.message import Message
from capstan.broker.store.status import PutResult, PutStatus
from capstan.broker.write_path import Gate, WritePath


def still_led(static: StaticTopics, queues: Iterable[tuple[str, int]]) -> Gate | None:
    """The check, right before an append, that this group still leads every static
    topic's logic queue among `queues` ((topic, queue) pairs, few and distinct; a move may
    have sealed one since they were chosen); None when none is a static topic's."""
    wanted = [(t, q) for t, q in queues if static.view(t) is not None]
    if not wanted:
        return None

    def check() -> PutResult | None:
        for topic, queue in wanted:
            view = static.view(topic)
            if view is None or queue not in view.led:
                return PutResult(
                    PutStatus.NOT_WRITEABLE,
                    detail=f"logic queue {queue} of static topic {topic!r} stopped taking "
                    "writes on this group (it is moving); retry",
                )
        return None

    return check


class StaticPlacement:
    def __init__(self, static: StaticTopics, writes: WritePath, links: GroupLinks | None) -> None:
        """`links` reach the other groups (None without a controller: nothing can be
        handed on, and a drained group's messages wait)."""
        self._static = static
        self._writes = writes
        self._links = links
        self._turns: dict[str, itertools.count[int]] = {}

    async def put(self, messages: Sequence[Message]) -> PutResult:
        """Store messages this broker produced itself (see the module's text)."""
        placed = self._place(messages, hand_on=True)
        if isinstance(placed, PutResult):
            return placed
        here, elsewhere = placed
        for group, handed in elsewhere.items():
            if self._links is None:
                return _refused(f"group {group!r} leads their queue, and no controller finds it")
            try:
                await self._links.place(group, handed)
            except (grpc.aio.AioRpcError, NoMaster) as exc:
                why = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                return PutResult(
                    PutStatus.SERVICE_NOT_AVAILABLE,
                    detail=f"group {group!r}, which leads their logic queues, did not take "
                    f"them: {why}",
                )
        if not here:
            return PutResult(PutStatus.PUT_OK)
        return await self._put_here(here)

    async def take(self, messages: Sequence[Message]) -> PutResult:
        """Store messages another group handed on (Admin.PlaceMessages): in logic queues
        this group leads, or not at all (NOT_WRITEABLE, saying why)."""
        placed = self._place(messages, hand_on=False)
        if isinstance(placed, PutResult):
            return placed
        return await self._put_here(placed[0])

    async def _put_here(self, messages: list[Message]) -> PutResult:
        batch = self._writes.admit(messages)
        if isinstance(batch, PutResult):
            return batch
        gate = still_led(self._static, {(m.topic, m.queue_id) for m in messages})
        return await self._writes.put_admitted(batch, gate)

    def _place(
        self, messages: Sequence[Message], hand_on: bool
    ) -> tuple[list[Message], dict[str, list[Message]]] | PutResult:
        here: list[Message] = []
        elsewhere: dict[str, list[Message]] = {}
        for m in messages:
            view = self._static.view(m.topic)
            if view is None or m.queue_id in view.led:
                here.append(m)
                continue
            if view.led_order:  # another logic queue this group leads
                turn = self._turns.setdefault(m.topic, itertools.count())
                m.queue_id = view.led_order[next(turn) % len(view.led_order)]
                here.append(m)
                continue
            if not hand_on:
                return _refused(
                    f"group {view.group!r} leads no logic queue of static topic {m.topic!r}"
                )
            if not 0 <= m.queue_id < view.mapping.total_queues:
                return _refused(f"static topic {m.topic!r} has no logic queue {m.queue_id}")
            leader = view.mapping.leader(m.queue_id)
            if not leader.takes_writes:
                return _refused(
                    f"logic queue {m.queue_id} of static topic {m.topic!r} is moving; retry"
                )
            elsewhere.setdefault(leader.group, []).append(m)
        return here, elsewhere


def _refused(detail: str) -> PutResult:
    return PutResult(PutStatus.NOT_WRITEABLE, detail=detail)
