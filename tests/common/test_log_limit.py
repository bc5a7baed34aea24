"""LimitedLog: one line per key and interval, with the count of the rest."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from capstan.common.log_limit import LimitedLog

log = logging.getLogger("tests.log_limit")


class Timers:
    def __init__(self) -> None:
        self.due: list[Callable[[], None]] = []

    def schedule(self, delay_s: float, callback: Callable[[], None]) -> None:
        assert delay_s == 60
        self.due.append(callback)

    def end_interval(self) -> None:
        due, self.due = self.due, []
        for callback in due:
            callback()


def test_a_flood_costs_one_line_per_key_and_interval(caplog: pytest.LogCaptureFixture) -> None:
    timers = Timers()
    limited = LimitedLog(log, 60, timers.schedule)
    for _ in range(1000):
        for key in ("a", "b"):
            limited.note(key, lambda k=key: log.warning("first %s", k), f"events of {key}")
    assert [r.getMessage() for r in caplog.records] == ["first a", "first b"]
    timers.end_interval()
    limited.note("a", lambda: log.warning("first a again"), "events of a")
    timers.end_interval()
    assert [r.getMessage() for r in caplog.records[2:]] == [
        "999 more events of a in the last 60 s",
        "999 more events of b in the last 60 s",
        "1 more events of a in the last 60 s",
    ]
    timers.end_interval()  # a quiet interval closes the key: its next event is logged
    limited.note("a", lambda: log.warning("first a again"), "events of a")
    assert caplog.records[-1].getMessage() == "first a again"
