"""Reading a consume queue with long polling: at the queue's end, wait for an arrival."""

from __future__ import annotations

import time

from capstan.broker.long_polling import ArrivalNotifier
from capstan.broker.store.message_store import DEFAULT_GET_MAX_BYTES, MessageStore
from capstan.broker.store.status import GetResult, GetStatus


class QueueReader:
    def __init__(self, store: MessageStore, arrivals: ArrivalNotifier) -> None:
        self._store = store
        self._arrivals = arrivals

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
        deadline = time.monotonic() + wait_s
        while True:
            result = self._store.get(topic, queue_id, offset, max_messages, tags, max_bytes)
            at_end = result.status is GetStatus.OFFSET_OVERFLOW_ONE or (
                result.status is GetStatus.NO_MESSAGE_IN_QUEUE and offset == 0
            )
            remaining = deadline - time.monotonic()
            if not at_end or remaining <= 0 or self._arrivals.closed:
                return result
            await self._arrivals.wait([topic], remaining)
