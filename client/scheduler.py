"""One daemon thread that runs small jobs at given times (RocketMQ's scheduled executors).

The consumer uses it for what happens "later": a pull delayed by flow control, a periodic
offset persist, a lock renewal, a local retry of a batch whose send-back failed. Jobs must
be short; anything slow belongs on a consume thread.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call_later(self, delay_s: float, job: Callable[[], None]) -> None:
        with self._wake:
            if self._stopped:
                return
            heapq.heappush(self._jobs, (time.monotonic() + delay_s, next(self._order), job))
            self._wake.notify()

    def every(
        self, interval_s: float, job: Callable[[], None], first_s: float | None = None
    ) -> None:
        """Run `job` every `interval_s` seconds (the first time after `first_s`)."""

        def again() -> None:
            try:
                job()
            finally:
                self.call_later(interval_s, again)

        self.call_later(interval_s if first_s is None else first_s, again)

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._jobs.clear()
            self._wake.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(5)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopped and (not self._jobs or self._jobs[0][0] > time.monotonic()):
                    timeout = self._jobs[0][0] - time.monotonic() if self._jobs else None
                    self._wake.wait(timeout)
                if self._stopped:
                    return
                _, _, job = heapq.heappop(self._jobs)
            try:
                job()
            except Exception:
                log.exception("%s: a scheduled job failed", self._name)
