"""Appending from asyncio, without ever waiting on the disk on the loop.

`put` prepares the batch and appends it with one CommitLog write, on the loop itself: a
write into the page cache costs less than handing the batch to a thread and back. With
ASYNC_FLUSH that is the answer. With SYNC_FLUSH the caller then awaits the flusher thread,
whose one fsync covers every append made since its last one (group commit), or answers
FLUSH_DISK_TIMEOUT when it takes longer than the flush timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from capstan.broker.store.message import Message
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.settings import FlushMode
from capstan.broker.store.status import PutResult, PutStatus


class AsyncAppender:
    """Use from one event loop: `await appender.put(messages)`."""

    def __init__(self, store: MessageStore) -> None:
        self._store = store
        self._sync = store.settings.flush_mode is FlushMode.SYNC_FLUSH
        self._timeout_s = store.settings.flush_disk_timeout_ms / 1000
        self._running = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._running = True

    async def stop(self) -> None:
        """Refuse what comes after; puts already appended still get their answer."""
        self._running = False

    async def put(self, messages: Sequence[Message]) -> PutResult:
        prepared, refusal = self._store.prepare(messages)
        if refusal is not None:
            return refusal
        if not self._running:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, detail="appender stopped")
        result = self._store.append_prepared(prepared)
        if not self._sync or not result.status.ok:
            return result
        last = result.appended[-1]
        loop = self._loop
        assert loop is not None, "start() the appender first"
        durable: asyncio.Future[bool | None] = loop.create_future()
        timer = loop.call_later(self._timeout_s, _settle, durable, None)

        def flushed(ok: bool) -> None:  # runs on the flusher thread
            loop.call_soon_threadsafe(_settle, durable, ok)

        end = last.phys_offset + last.size
        flusher = self._store.flusher
        if not flusher.request_nowait(end, flushed):
            loop.run_in_executor(None, flusher.request, end, flushed)
        ok = await durable
        timer.cancel()
        if ok is None:
            return PutResult(
                PutStatus.FLUSH_DISK_TIMEOUT,
                result.appended,
                result.store_timestamp_ms,
                "fsync too slow",
            )
        if not ok:
            return PutResult(
                PutStatus.IO_ERROR, result.appended, result.store_timestamp_ms, "fsync failed"
            )
        return result


def _settle(future: asyncio.Future[bool | None], ok: bool | None) -> None:
    if not future.done():
        future.set_result(ok)
