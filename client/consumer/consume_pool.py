"""ConsumePool: the consume services' fixed set of threads, fed through one queue.

`concurrent.futures.ThreadPoolExecutor` builds a Future, a work item and a condition for
every task and checks its thread count on every submit; at one message per listener call
that bookkeeping cost more than the listener. Nobody waits on a consume task's result, so
this pool hands plain (function, arguments) pairs to its threads through a SimpleQueue and
logs what a task raises.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_STOP = object()


class ConsumePool:
    def __init__(self, threads: int, name: str) -> None:
        if threads < 1:
            raise ValueError(f"a consume pool needs at least one thread, not {threads}")
        self._tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{n}", daemon=True)
            for n in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, task: Callable[..., object], *args: Any) -> None:
        """Run `task(*args)` on a pool thread; ignored once the pool is shut down."""
        if not self._closed:
            self._tasks.put((task, args))

    def shutdown(self, wait: bool = True) -> None:
        """Drop the tasks not yet started, let the running ones finish, stop the threads."""
        self._closed = True
        while True:
            try:
                self._tasks.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            self._tasks.put(_STOP)
        if wait:
            current = threading.current_thread()
            for thread in self._threads:
                if thread is not current:
                    thread.join()

    def _work(self) -> None:
        get = self._tasks.get
        while True:
            item = get()
            if item is _STOP:
                return
            task, args = item
            try:
                task(*args)
            except Exception:
                log.exception("a consume task failed")
