"""Making the CommitLog durable: group commit for SYNC_FLUSH, an interval for ASYNC_FLUSH.

One thread owns every fsync of the CommitLog. In SYNC_FLUSH mode writers register the
offset they need durable; the thread takes all waiting requests at once, runs one
fdatasync that covers them all, and then answers each. Threads wait on an Event; asyncio
code passes a callback that resolves its future on the loop, so no event loop ever blocks
on fsync.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from capstan.broker.store.commitlog import CommitLog

log = logging.getLogger(__name__)

FlushCallback = Callable[[bool], None]
"""Called from the flush thread: True once durable, False if the fsync failed."""


@dataclass(slots=True)
class _Request:
    offset: int
    callback: FlushCallback


class CommitLogFlusher:
    """The thread that fsyncs the CommitLog (see the module docstring)."""

    def __init__(self, commitlog: CommitLog, group_commit: bool, interval_s: float) -> None:
        self._commitlog = commitlog
        self._group_commit = group_commit
        self._interval_s = interval_s
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._running = False
        self._thread: threading.Thread | None = None
        self.failure: OSError | None = None
        self.fsync_count = 0

    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(
            target=self._flush_routine, name="commitlog-flush", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Answer every waiting writer with a final flush, then end the thread."""
        with self._cond:
            self._running = False
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        self._flush_once()

    def request(self, offset: int, callback: FlushCallback) -> None:
        """Call `callback` once everything below `offset` is durable (or fsync failed)."""
        self._register(offset, callback, blocking=True)

    def request_nowait(self, offset: int, callback: FlushCallback) -> bool:
        """Like `request`, for an event loop: False, and nothing registered, when the
        flusher's lock is busy this instant (call `request` from a thread then)."""
        return self._register(offset, callback, blocking=False)

    def _register(self, offset: int, callback: FlushCallback, blocking: bool) -> bool:
        if self.failure is not None:
            callback(False)
            return True
        if self._commitlog.flushed_offset >= offset:
            callback(True)
            return True
        if blocking:
            with self._cond:
                running = self._enqueue(offset, callback)
        elif self._cond.acquire(blocking=False):
            try:
                running = self._enqueue(offset, callback)
            finally:
                self._cond.release()
        else:
            return False
        if not running:  # stopped (the store is closing): nobody else will flush this
            self._flush_once()
        return True

    def _enqueue(self, offset: int, callback: FlushCallback) -> bool:
        """Caller holds `_cond`; returns whether the flusher thread is running."""
        self._pending.append(_Request(offset, callback))
        self._cond.notify()
        return self._running

    def wait(self, offset: int, timeout_s: float) -> bool | None:
        """Block until `offset` is durable: True, fsync failed: False, timed out: None."""
        done = threading.Event()
        result: list[bool] = []

        def answer(ok: bool) -> None:
            result.append(ok)
            done.set()

        self.request(offset, answer)
        return result[0] if done.wait(timeout_s) else None

    def _flush_routine(self) -> None:
        while True:
            with self._cond:
                if self._running and not self._pending:
                    self._cond.wait(None if self._group_commit else self._interval_s)
                if not self._running:
                    return
            self._flush_once()

    def _flush_once(self) -> None:
        with self._cond:
            pending, self._pending = self._pending, []
        ok = self.failure is None
        if ok:
            try:
                self._commitlog.sync()
                self.fsync_count += 1
            except OSError as exc:
                # After a failed fsync the kernel may have dropped the dirty pages: what is on
                # disk is unknown, so the store must stop acknowledging (see status.IO_ERROR).
                log.critical("fsync of the CommitLog failed: %s; refusing further writes", exc)
                self.failure = exc
                ok = False
        flushed = self._commitlog.flushed_offset
        for request in pending:
            if not ok or request.offset <= flushed:
                request.callback(ok)
            else:  # appended after our snapshot; the next round covers it
                with self._cond:
                    self._pending.append(request)
