"""A stop request that signals set and the main thread waits on.

Not a `threading.Event`: its `set()` takes the event's own lock, and a signal handler runs
on the main thread between two bytecodes, so a signal that lands while that thread is inside
`Event.wait()` holding the same lock deadlocks the process (the handler waits for a lock its
own thread holds). Here the handler only flips a flag; `signal.set_wakeup_fd` has the
interpreter write a byte to a socket at the same moment, which ends a `wait` at once.
"""

from __future__ import annotations

import select
import signal
import socket
from collections.abc import Iterable


class SignalStop:
    """Install once, on the main thread; then `wait(timeout_s)` / `is_set()` from it."""

    def __init__(self) -> None:
        self._requested = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    def install(self, signals: Iterable[signal.Signals]) -> None:
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        for sig in signals:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._requested = True

    def is_set(self) -> bool:
        return self._requested

    def wait(self, timeout_s: float | None = None) -> bool:
        """True once a signal asked to stop; False when `timeout_s` passed first."""
        if not self._requested:
            select.select([self._wake_r], [], [], timeout_s)
            try:
                while self._wake_r.recv(512):
                    pass
            except BlockingIOError:
                pass
        return self._requested
