"""Reading a consume queue with long polling: at the queue's end, wait for an arrival.

Offsets are the client's: a static topic's queue is read at logic offsets, translated to
this group's physical queue on the way in and back on the way out (broker/static_topics.py).
A consumer group that reads a static topic in order (a FIFO group, or one of whose members
holds the queue's lock: the SDK's orderly consumers) reads nothing of an item that
continues another group's item before it finished that one there (OrderGate): such a read
waits, as at the queue's end, until the check passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from capstan.broker.long_polling import ArrivalNotifier
from capstan.broker.static_topics import OrderGate, StaticTopics, StaticView
from capstan.broker.store.message_store import DEFAULT_GET_MAX_BYTES, MessageStore
from capstan.broker.store.status import GetResult, GetStatus
from capstan.common.queue_mapping import MappingItem

STATIC_RECHECK_S = 0.5
"""How often a read of a static topic's queue waiting at its end looks whether the queue
moved away meanwhile (then it answers at once, naming the group it went to)."""


class QueueReader:
    def __init__(
        self,
        store: MessageStore,
        arrivals: ArrivalNotifier,
        static: StaticTopics,
        gate: OrderGate | None = None,
        in_order: Callable[[str, str, int], bool] | None = None,
    ) -> None:
        """`in_order(group, topic, queue)`: whether that group reads the queue in order."""
        self._store = store
        self._arrivals = arrivals
        self._static = static
        self._gate = gate
        self._in_order = in_order

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        tags: set[str] | None,
        wait_s: float,
        max_bytes: int = DEFAULT_GET_MAX_BYTES,
        group: str = "",
        wait_when_held: bool = True,
    ) -> GetResult:
        """Read a queue from `offset`; at its end, wait up to `wait_s` for a message,
        answering the moment one arrives (long polling). `group` names the consumer group
        reading (none for a read of no group's). An ordered read held at an item that
        continues another group's waits the same way, or, unless `wait_when_held`, is
        answered at once (its client commits, freeing it: `held_at`)."""
        view = self._static.view(topic)
        ordered = False
        if view is not None:
            offset = view.physical_offset(queue_id, offset)
            ordered = bool(group) and self._reads_in_order(group, topic, queue_id)
            if _ended_here(view, queue_id, offset):
                wait_s = 0.0  # nothing more comes here: the queue goes on at its leader
        deadline = time.monotonic() + wait_s
        while True:
            stop = self._stop(group, topic, queue_id) if ordered else None
            if stop is not None and offset >= stop:
                result = self._held(group, topic, queue_id, offset)
                if not wait_when_held:
                    return _as_logic(view, queue_id, result) if view is not None else result
            else:
                result = self._store.get(topic, queue_id, offset, max_messages, tags, max_bytes)
                if stop is not None:
                    result = _before(result, stop)
            at_end = result.status is GetStatus.OFFSET_OVERFLOW_ONE or (
                result.status is GetStatus.NO_MESSAGE_IN_QUEUE and offset == 0
            )
            remaining = deadline - time.monotonic()
            if not at_end or remaining <= 0 or self._arrivals.closed:
                return result if view is None else _as_logic(view, queue_id, result)
            if view is None:
                await self._arrivals.wait([topic], remaining)
                continue
            # A static queue may move away while the read waits: look again every so often.
            await self._arrivals.wait([topic], min(remaining, STATIC_RECHECK_S))
            view = self._static.view(topic) or view
            if _ended_here(view, queue_id, offset):
                deadline = time.monotonic()

    def older_item(self, topic: str, queue_id: int, offset: int) -> MappingItem | None:
        """The item of another group that holds logic offset `offset` of a static topic's
        logic queue this group leads (its reads are passed there); None for any other."""
        view = self._static.view(topic)
        return None if view is None else view.older_item(queue_id, offset)

    def held_at(self, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """Whether an ordered read of `group` at logic offset `offset` is held there (until
        the group finished the item before it: `stop_at`)."""
        view = self._static.view(topic)
        if view is None or not group or not self._reads_in_order(group, topic, queue_id):
            return False
        stop = self._stop(group, topic, queue_id)
        return stop is not None and view.physical_offset(queue_id, offset) >= stop

    def continues_on(self, topic: str, queue_id: int, offset: int) -> str:
        """The group a static topic's logic queue goes on at when a read that reached logic
        offset `offset` here has read everything this group holds of it (the queue moved
        away); "" otherwise."""
        view = self._static.view(topic)
        if view is None or not _ended_here(view, queue_id, view.physical_offset(queue_id, offset)):
            return ""
        return view.mapping.leader(queue_id).group

    def _reads_in_order(self, group: str, topic: str, queue_id: int) -> bool:
        return self._in_order is not None and self._in_order(group, topic, queue_id)

    def _stop(self, group: str, topic: str, queue_id: int) -> int | None:
        if self._gate is None:
            return None
        return self._gate.stop_at(group, topic, queue_id, pulled=True)

    def _held(self, group: str, topic: str, queue_id: int, offset: int) -> GetResult:
        """Nothing yet, as at the queue's end: the group must finish another group's item
        first (the gate is asked to check)."""
        if self._gate is not None:
            self._gate.blocked(group, topic, queue_id)
        low, high = self._store.queue_bounds(topic, queue_id) or (0, 0)
        return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, [], offset, low, high)


def _ended_here(view: StaticView, queue_id: int, physical: int) -> bool:
    """Whether physical offset `physical` is at or past the end of the last item this group
    holds of a logic queue another group leads now."""
    if queue_id in view.led:
        return False
    items = view.items_here.get(queue_id, ())
    return bool(items) and items[-1].logic_end is not None and physical >= items[-1].end_offset


def _before(result: GetResult, stop: int) -> GetResult:
    """`result` without what lies at or past physical offset `stop`."""
    if result.next_begin_offset <= stop:
        return result
    kept = [m for m in result.messages if m.queue_offset < stop]
    status = result.status if kept else GetStatus.OFFSET_OVERFLOW_ONE
    return replace(result, status=status, messages=kept, next_begin_offset=stop)


def _as_logic(view: StaticView, queue_id: int, result: GetResult) -> GetResult:
    """`result` in logic offsets. Its messages were read for this answer alone, so their
    queue offsets are rewritten in place."""
    logic = view.logic_offset
    for m in result.messages:
        m.queue_offset = logic(queue_id, m.queue_offset)
    return replace(
        result,
        next_begin_offset=logic(queue_id, result.next_begin_offset),
        min_offset=logic(queue_id, result.min_offset),
        max_offset=logic(queue_id, result.max_offset),
        unreadable_offsets=[logic(queue_id, o) for o in result.unreadable_offsets],
    )
