"""Reading a consume queue with long polling: at the queue's end, wait for an arrival.

Offsets are the client's: a static topic's queue is read at logic offsets, translated to
this group's physical queue on the way in and back on the way out (broker/static_topics.py).
"""

from __future__ import annotations

import time
from dataclasses import replace

from capstan.broker.long_polling import ArrivalNotifier
from capstan.broker.static_topics import StaticTopics, StaticView
from capstan.broker.store.message_store import DEFAULT_GET_MAX_BYTES, MessageStore
from capstan.broker.store.status import GetResult, GetStatus


class QueueReader:
    def __init__(
        self, store: MessageStore, arrivals: ArrivalNotifier, static: StaticTopics
    ) -> None:
        self._store = store
        self._arrivals = arrivals
        self._static = static

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        tags: set[str] | None,
        wait_s: float,
        max_bytes: int = DEFAULT_GET_MAX_BYTES,
    ) -> GetResult:
        """Read a queue from `offset`; at its end, wait up to `wait_s` for a message,
        answering the moment one arrives (long polling)."""
        view = self._static.view(topic)
        if view is not None:
            offset = view.physical_offset(queue_id, offset)
        deadline = time.monotonic() + wait_s
        while True:
            result = self._store.get(topic, queue_id, offset, max_messages, tags, max_bytes)
            at_end = result.status is GetStatus.OFFSET_OVERFLOW_ONE or (
                result.status is GetStatus.NO_MESSAGE_IN_QUEUE and offset == 0
            )
            remaining = deadline - time.monotonic()
            if not at_end or remaining <= 0 or self._arrivals.closed:
                return result if view is None else _as_logic(view, queue_id, result)
            await self._arrivals.wait([topic], remaining)


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
