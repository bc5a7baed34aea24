"""Log lines that a flood cannot multiply: at most one line per key and interval.

The first event of a key is logged as it comes; the next ones within the interval are only
counted, and when the interval ends one line says how many there were (then the next
interval counts on). A key that stays quiet for a whole interval starts afresh. A flood of
bad calls therefore costs the log one line per method a minute, whatever its rate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

Schedule = Callable[[float, Callable[[], None]], object]
"""Runs a callback after a delay in seconds (asyncio's `loop.call_later` by default)."""


def _call_later(delay_s: float, callback: Callable[[], None]) -> object:
    return asyncio.get_running_loop().call_later(delay_s, callback)


@dataclass
class _Window:
    counted: int = 0


class LimitedLog:
    def __init__(
        self, logger: logging.Logger, interval_s: float, schedule: Schedule = _call_later
    ) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._schedule = schedule
        self._windows: dict[str, _Window] = {}

    def note(self, key: str, log_first: Callable[[], None], counted_as: str) -> None:
        """An event of `key`: `log_first()` logs it when it opens an interval; otherwise
        it is counted, reported at the interval's end as "<n> more <counted_as> ..."."""
        window = self._windows.get(key)
        if window is not None:
            window.counted += 1
            return
        self._windows[key] = _Window()
        self._schedule(self._interval_s, lambda: self._close(key, counted_as))
        log_first()

    def _close(self, key: str, counted_as: str) -> None:
        window = self._windows[key]
        if not window.counted:
            del self._windows[key]
            return
        self._logger.warning(
            "%d more %s in the last %.0f s", window.counted, counted_as, self._interval_s
        )
        window.counted = 0
        self._schedule(self._interval_s, lambda: self._close(key, counted_as))
