"""Waking suspended receives and pulls the moment a message arrives on their topic, or
something the topic holds in flight may be handed out again (a FIFO queue freed by an ack,
a changed invisible time)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

ANSWER_MARGIN_S = 0.5
"""A suspended call answers this long before its gRPC deadline, so the answer arrives."""


def suspend_s(requested_ms: float, limit_ms: float, time_left_s: float | None) -> float:
    """How long a call may stay suspended: what it asked for, at most `limit_ms`, and
    ending `ANSWER_MARGIN_S` before its deadline (`time_left_s`, None if it has none)."""
    wait_s = min(max(requested_ms, 0), limit_ms) / 1000
    if time_left_s is not None:
        wait_s = min(wait_s, time_left_s - ANSWER_MARGIN_S)
    return max(wait_s, 0.0)


class ArrivalNotifier:
    """Per-topic wake-ups for long polling; use from the broker's event loop only."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self.closed = False
        """Set on shutdown: suspended calls answer now instead of waiting again."""

    def notify(self, topic: str) -> None:
        """Wake every call waiting on `topic`; each looks again and may wait again."""
        waiters = self._waiters.pop(topic, None)
        if not waiters:
            return
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def notify_all(self) -> None:
        """Wake everyone and refuse further waits (on shutdown, so calls answer at once)."""
        self.closed = True
        for topic in list(self._waiters):
            self.notify(topic)

    async def wait(self, topics: Iterable[str], timeout_s: float) -> bool:
        """Wait until a message arrives on one of `topics`; False on timeout."""
        if timeout_s <= 0 or self.closed:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        names = list(topics)
        for name in names:
            self._waiters.setdefault(name, set()).add(fut)
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: see common/aio_wait.py
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            for name in names:
                waiting = self._waiters.get(name)
                if waiting is not None:
                    waiting.discard(fut)
                    if not waiting:
                        del self._waiters[name]

    @property
    def waiting(self) -> int:
        """Calls suspended now (a call waiting on several topics counts once)."""
        return len({f for fs in self._waiters.values() for f in fs})
