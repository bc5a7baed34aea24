"""The persistent timer: delayed messages wait in the timer topic until they are due.

A delayed message is stored in `SCHEDULE_TOPIC_XXXX` (one queue) with its real topic and
queue in properties; its consume-queue unit carries the delivery time in place of the tag
hash. The timer keeps a heap of what is pending, sleeps until the earliest is due, and
then stores a copy in the real topic. `timer_progress.json` records the lowest timer-queue
offset not yet delivered; on start the timer rebuilds its heap from the consume queue from
there, reading 20-byte units only. A crash between delivering and recording progress
delivers again (at least once, never lost).

The delay may be any time up to `max_delay_ms`.

A delayed message can be recalled while it waits (RecallMessage): it is taken out of the
schedule and a recall marker naming its timer-queue offset is parked after it, due at once
(delivery time 0). A rebuild that meets the marker therefore handles it before the message
it cancels, so a recalled message is never delivered after a restart or a failover either.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from capstan.broker.relocation import park, unpark
from capstan.broker.store.message import Message
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.properties import PROPERTY_RECALLS, PROPERTY_TIMER_DELIVER_MS
from capstan.broker.store.record import CorruptRecord
from capstan.broker.store.status import PutResult, PutStatus
from capstan.broker.system_topics import TIMER_TOPIC
from capstan.common.aio_wait import wait_event
from capstan.common.clock import now_ms
from capstan.common.disk_full import RoutineFailures
from capstan.common.durable_files import replace_durably

log = logging.getLogger(__name__)

Put = Callable[[list[Message]], Awaitable[PutResult]]
_BATCH = 256
_RETRY_S = 1.0


class NotWaiting(Exception):
    """The message to recall is not waiting in the timer (delivered, or being delivered)."""


def park_until(message: Message, deliver_at_ms: int) -> Message:
    """The timer-topic copy of `message`, to be delivered at `deliver_at_ms`."""
    return park(message, TIMER_TOPIC, {PROPERTY_TIMER_DELIVER_MS: str(deliver_at_ms)})


def recall_marker(timer_offset: int) -> Message:
    """The timer-topic record that cancels the parked message at `timer_offset`."""
    props = {PROPERTY_TIMER_DELIVER_MS: "0", PROPERTY_RECALLS: str(timer_offset)}
    return Message(TIMER_TOPIC, 0, b"recall", props)


class TimerService:
    def __init__(self, store: MessageStore, progress_path: Path, progress_interval_ms: int) -> None:
        self._store = store
        self._progress_path = progress_path
        self._progress_interval_s = progress_interval_ms / 1000
        self._heap: list[tuple[int, int, int]] = []  # (deliver_at_ms, queue_offset, phys)
        self._pending: set[int] = set()
        self._delivering: set[int] = set()  # taken from the heap, being stored
        self._recalled: set[int] = set()  # timer-queue offsets never to deliver
        self._recorded = 0
        self._parked_end = 0  # one past the highest timer-queue offset the heap has seen
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._put: Put | None = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def start(self, put: Put) -> None:
        self._put = put
        self._rebuild()
        self._task = asyncio.create_task(self._deliver_routine(), name="timer-deliver")

    async def stop(self) -> None:
        """Stop delivering and write the progress down (if it ever started here)."""
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        self._record_progress(self._low_water())

    def _rebuild(self) -> None:
        self._heap.clear()
        self._pending.clear()
        self._recalled.clear()  # the markers in the queue say it again
        self._parked_end = 0
        start = 0
        try:
            start = int(json.loads(self._progress_path.read_text())["offset"])
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("timer progress unreadable (%s); rescanning the timer queue", exc)
        queue = self._store.queues.find(TIMER_TOPIC, 0)
        if queue is None:
            return
        offset = max(start, queue.min_offset)
        while offset < queue.max_offset:
            units = queue.read_raw(offset, 4096)
            if not units:
                break
            for i, (phys, size, deliver_ms) in enumerate(units):
                if size:
                    self._add(deliver_ms, offset + i, phys)
            offset += len(units)
        self._recorded = start
        self._parked_end = offset
        log.info("timer: %d delayed messages pending", len(self._pending))

    def _add(self, deliver_ms: int, queue_offset: int, phys: int) -> None:
        heapq.heappush(self._heap, (deliver_ms, queue_offset, phys))
        self._pending.add(queue_offset)
        self._parked_end = max(self._parked_end, queue_offset + 1)

    async def schedule(self, messages: list[Message], deliver_at_ms: list[int]) -> PutResult:
        """Park messages until their delivery times."""
        assert self._put is not None
        result = await self._put(
            [park_until(m, t) for m, t in zip(messages, deliver_at_ms, strict=True)]
        )
        for appended, at in zip(result.appended, deliver_at_ms, strict=False):
            self._add(at, appended.queue_offset, appended.phys_offset)
        self._wake.set()
        return result

    async def recall(self, timer_offset: int) -> PutResult:
        """Cancel the delayed message parked at `timer_offset`: the marker's write result
        (a refused write cancels nothing). Recalling it again is harmless; raises
        NotWaiting once it has been (or is being) delivered."""
        assert self._put is not None
        if timer_offset in self._recalled:
            return PutResult(PutStatus.PUT_OK)
        self._check_waiting(timer_offset)
        result = await self._put([recall_marker(timer_offset)])
        if not result.status.ok:
            return result
        if timer_offset not in self._recalled:
            self._check_waiting(timer_offset)  # the timer may have taken it meanwhile
            self._cancel(timer_offset)
        for appended in result.appended:  # rebuilds read the marker; the heap needs it not
            self._parked_end = max(self._parked_end, appended.queue_offset + 1)
        return result

    def _check_waiting(self, timer_offset: int) -> None:
        if timer_offset not in self._pending or timer_offset in self._delivering:
            raise NotWaiting(
                f"no delayed message waits at timer offset {timer_offset}: "
                "it has been delivered (or is being delivered)"
            )

    def _cancel(self, timer_offset: int) -> None:
        self._recalled.add(timer_offset)
        self._pending.discard(timer_offset)

    async def _deliver_routine(self) -> None:
        last_record = time.monotonic()
        failures = RoutineFailures(log, "timer deliveries")
        while True:
            wait_s = self._due_in_s()
            try:
                if wait_s > 0:
                    self._wake.clear()
                    await wait_event(self._wake, min(wait_s, 1.0))
                else:
                    await self._deliver_due()
                if time.monotonic() - last_record >= self._progress_interval_s:
                    low = self._low_water()
                    if low != self._recorded:
                        await asyncio.to_thread(self._record_progress, low)
                    last_record = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - the routine retries whatever failed
                failures.failed(exc)
                await asyncio.sleep(_RETRY_S)
            else:
                failures.succeeded()

    def _due_in_s(self) -> float:
        if not self._heap:
            return 1.0
        return (self._heap[0][0] - now_ms()) / 1000

    async def _deliver_due(self) -> None:
        assert self._put is not None
        now = now_ms()
        due: list[tuple[int, int, int]] = []
        while self._heap and self._heap[0][0] <= now and len(due) < _BATCH:
            due.append(heapq.heappop(self._heap))
        self._delivering = {queue_offset for _, queue_offset, _ in due}
        try:
            await self._store_due(due)
        finally:
            self._delivering = set()

    async def _store_due(self, due: list[tuple[int, int, int]]) -> None:
        assert self._put is not None
        messages: list[Message] = []
        recalled: list[int] = []
        for _, queue_offset, phys in due:  # in heap order: a marker before what it recalls
            if queue_offset in self._recalled:
                recalled.append(queue_offset)
                continue
            try:
                parked = self._store.read_message(phys)
            except CorruptRecord:
                parked = None
            recalls = parked.properties.get(PROPERTY_RECALLS) if parked is not None else None
            if recalls is not None:
                if recalls.isdigit() and int(recalls) in self._pending:
                    self._cancel(int(recalls))
                continue
            restored = unpark(parked, (PROPERTY_TIMER_DELIVER_MS,)) if parked is not None else None
            if restored is None:
                log.error("timer: dropping unreadable delayed message at %d", phys)
            elif self._store.topics.get(restored.topic) is None:
                log.warning("timer: topic %s no longer exists; dropping", restored.topic)
            else:
                messages.append(restored)
        result = await self._put(messages) if messages else None
        if result is not None and not result.status.ok:
            for item in due:
                heapq.heappush(self._heap, item)
            raise RuntimeError(f"storing due messages failed: {result.status.name}")
        for _, queue_offset, _ in due:
            self._pending.discard(queue_offset)
        self._recalled.difference_update(recalled)  # out of the heap: nothing left to stop

    def _low_water(self) -> int:
        """The lowest timer-queue offset not yet delivered. Computed on the loop: a parked
        message becomes pending only once its `schedule` call resumes, so the queue's own
        end could run ahead of what the heap holds."""
        return min(self._pending, default=self._parked_end)

    def _record_progress(self, low: int) -> None:
        replace_durably(self._progress_path, json.dumps({"offset": low}).encode())
        self._recorded = low

    @property
    def recorded(self) -> int:
        """The progress last written down: every timer-queue offset below was delivered."""
        return self._recorded

    def adopt_progress(self, document: dict[str, int]) -> None:
        """A slave takes its master's progress, to start from there once promoted."""
        if self._task is not None:
            raise RuntimeError("the timer runs here; it takes no progress from elsewhere")
        self._record_progress(int(document["offset"]))
