"""A thread that says when the server's event loop stops running, and where it is.

Everything a broker or controller does runs on one asyncio loop. Code that blocks it (a
synchronous call on the loop's thread, a lock taken there) stops every heartbeat, stream
and call at once, and nothing on the loop can report it. This thread asks the loop to run a
callback every `CHECK_S`; once one has waited `BLOCKED_S`, it logs the loop thread's
stack (once per blockage), and when the loop runs again, for how long it did not. When
this thread did not run either (the process stopped with SIGSTOP, or not scheduled), it
says that instead: the loop was not to blame.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

log = logging.getLogger(__name__)

CHECK_S = 0.5
BLOCKED_S = 5.0
"""Longer than any pause a loaded 2-core machine gives a runnable process."""


class LoopWatch:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        blocked_s: float = BLOCKED_S,
        check_s: float = CHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loop = loop
        self._blocked_s = blocked_s
        self._check_s = check_s
        self._clock = clock
        self._loop_thread = threading.get_ident()
        """Made on the loop's thread (the server's start)."""
        self._ran_at = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="loop-watch", daemon=True)
        self.blockages = 0
        """How many times the loop was found blocked."""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _ran(self) -> None:
        self._ran_at = self._clock()

    def _watch(self) -> None:
        told_at: float | None = None
        woke_at = self._clock()
        while not self._stop.wait(self._check_s):
            now = self._clock()
            slept, woke_at = now - woke_at, now
            if slept > self._check_s + self._blocked_s / 2:
                # This thread did not run either: the whole process was stopped (SIGSTOP)
                # or not scheduled, which says nothing of the loop. It starts afresh.
                log.warning("the process did not run for %.1f s", slept)
                self._ran_at = now
                told_at = None
            try:
                self._loop.call_soon_threadsafe(self._ran)
            except RuntimeError:
                return  # the loop is closed
            waited = self._clock() - self._ran_at
            if waited < self._blocked_s + self._check_s:
                if told_at is not None:
                    log.warning("the event loop runs again after %.1f s", self._ran_at - told_at)
                    told_at = None
                continue
            if told_at is None:
                told_at = self._ran_at
                self.blockages += 1
                log.error(
                    "the event loop has not run for %.1f s; its thread is at:\n%s",
                    waited,
                    self._loop_stack(),
                )

    def _loop_stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return "  (the loop's thread is gone)"
        return "".join(traceback.format_stack(frame, limit=30)).rstrip()
