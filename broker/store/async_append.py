"""Appending from asyncio, without ever waiting on the disk on the loop.

`put` admits the batch (checks and encodes it once) and `append` appends an admitted batch
with one CommitLog write, on the loop itself: a write into the page cache costs less than
handing the batch to a thread and back. With ASYNC_FLUSH that is the answer. With
SYNC_FLUSH the caller then awaits the flusher thread, whose one fsync covers every append
made since its last one (group commit), or answers FLUSH_DISK_TIMEOUT when it takes longer
than the flush timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from capstan.broker.store.admission import AdmittedBatch
from capstan.broker.store.message import Message
from capstan.broker.store.message_store import MessageStore, after_flush
from capstan.broker.store.status import PutResult, PutStatus
from capstan.common.store_settings import FlushMode


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
        """Admit the batch (store/admission.py), then append it."""
        batch = self._store.admit(messages)
        if isinstance(batch, PutResult):
            return batch
        return await self.append(batch)

    @property
    def waits_for_flush(self) -> bool:
        """Whether an append is answered only once fsynced (SYNC_FLUSH)."""
        return self._sync

    async def append(self, batch: AdmittedBatch) -> PutResult:
        """Append a batch admitted before; with SYNC_FLUSH, answer once it is durable."""
        return await self.until_durable(self.write(batch))

    def write(self, batch: AdmittedBatch) -> PutResult:
        """Append a batch admitted before into the page cache, not waiting for its fsync;
        `until_durable` waits for it (a replicated write waits for it and for its copies
        at once)."""
        if not self._running:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, detail="appender stopped")
        return self._store.append(batch)

    async def until_durable(self, result: PutResult) -> PutResult:
        """`result` of `write`, once fsynced with SYNC_FLUSH (FLUSH_DISK_TIMEOUT when the
        fsync takes longer than the flush timeout); as it is otherwise."""
        if not self._sync or not result.status.ok:
            return result
        last = result.appended[-1]
        loop = self._loop
        assert loop is not None, "start() the appender first"
        durable: asyncio.Future[bool | None] = loop.create_future()
        timer = loop.call_later(self._timeout_s, _settle, durable, None)

        def flushed(ok: bool) -> None:  # runs on the flusher thread
            if loop.is_closed():
                return  # the loop ended (a store closed after it): nobody waits any more
            try:
                loop.call_soon_threadsafe(_settle, durable, ok)
            except RuntimeError:  # closed between the check and the call
                pass

        end = last.phys_offset + last.size
        flusher = self._store.flusher
        if not flusher.request_nowait(end, flushed):
            loop.run_in_executor(None, flusher.request, end, flushed)
        ok = await durable
        timer.cancel()
        return after_flush(result, ok)


def _settle(future: asyncio.Future[bool | None], ok: bool | None) -> None:
    if not future.done():
        future.set_result(ok)
