"""Appending from asyncio: many concurrent callers, one write and one fsync per round.

`put` prepares its batch on the loop, queues it and awaits a future. One append thread
takes everything queued at that moment and appends it with a single CommitLog write; with
SYNC_FLUSH it then hands the round to the flusher, whose one fsync answers every caller
in it. Futures are resolved on the loop in one call per round, and one timer per round
answers FLUSH_DISK_TIMEOUT, so the loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from capstan.broker.store.message import Message
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.record import PreparedRecord
from capstan.broker.store.settings import FlushMode
from capstan.broker.store.status import PutResult, PutStatus


@dataclass(slots=True)
class _Waiter:
    records: list[PreparedRecord]
    future: asyncio.Future[PutResult]
    result: PutResult | None = None


class AsyncAppender:
    """Use from one event loop: `await appender.put(messages)`."""

    def __init__(self, store: MessageStore) -> None:
        self._store = store
        self._sync = store.settings.flush_mode is FlushMode.SYNC_FLUSH
        self._timeout_s = store.settings.flush_disk_timeout_ms / 1000
        self._queued: list[_Waiter] = []
        self._cond = threading.Condition()
        self._running = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._running = True
        self._thread = threading.Thread(
            target=self._append_routine, name="store-append", daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        """Append what is queued, answer it, and end the thread."""
        with self._cond:
            self._running = False
            self._cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    async def put(self, messages: Sequence[Message]) -> PutResult:
        prepared, refusal = self._store.prepare(messages)
        if refusal is not None:
            return refusal
        assert self._loop is not None, "start() the appender first"
        waiter = _Waiter(prepared, self._loop.create_future())
        with self._cond:
            if not self._running:
                return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, detail="appender stopped")
            self._queued.append(waiter)
            if len(self._queued) == 1:
                self._cond.notify()
        return await waiter.future

    def _append_routine(self) -> None:
        while True:
            with self._cond:
                while self._running and not self._queued:
                    self._cond.wait()
                batch, self._queued = self._queued, []
                if not batch and not self._running:
                    return
            self._append_round(batch)

    def _append_round(self, batch: list[_Waiter]) -> None:
        records = [r for w in batch for r in w.records]
        result = self._store.append_prepared(records)
        _split(batch, result)
        assert self._loop is not None
        if not self._sync or not result.status.ok:
            self._loop.call_soon_threadsafe(_answer, batch, None)
            return
        last = result.appended[-1]
        timer: list[asyncio.TimerHandle] = []
        self._loop.call_soon_threadsafe(self._arm_timeout, batch, timer)
        loop = self._loop

        def durable(ok: bool) -> None:
            loop.call_soon_threadsafe(_answer, batch, ok, timer)

        self._store.flusher.request(last.phys_offset + last.size, durable)

    def _arm_timeout(self, batch: list[_Waiter], timer: list[asyncio.TimerHandle]) -> None:
        if any(not w.future.done() for w in batch):
            assert self._loop is not None
            timer.append(self._loop.call_later(self._timeout_s, _answer, batch, None, timer, True))


def _split(batch: list[_Waiter], result: PutResult) -> None:
    """Give each waiter its own slice of a round's result."""
    at = 0
    for waiter in batch:
        n = len(waiter.records)
        appended = result.appended[at : at + n] if result.status.ok else []
        waiter.result = PutResult(result.status, appended, result.store_timestamp_ms, result.detail)
        at += n


def _answer(
    batch: list[_Waiter],
    durable: bool | None,
    timer: list[asyncio.TimerHandle] | None = None,
    timed_out: bool = False,
) -> None:
    """Runs on the loop: resolve every still-open future of a round."""
    if timer and not timed_out:
        timer[0].cancel()
    for waiter in batch:
        if waiter.future.done() or waiter.result is None:
            continue
        result = waiter.result
        if timed_out:
            result = PutResult(
                PutStatus.FLUSH_DISK_TIMEOUT,
                result.appended,
                result.store_timestamp_ms,
                "fsync too slow",
            )
        elif durable is False:
            result = PutResult(
                PutStatus.IO_ERROR, result.appended, result.store_timestamp_ms, "fsync failed"
            )
        waiter.future.set_result(result)
