"""ProcessQueue: the consumer's snapshot of one message queue it owns (seed 000).

Pulled messages wait here, keyed by queue offset, until a listener has consumed them. The
pull loop reads its flow-control figures (cached count, bytes, offset span); the consume
services take and remove messages; the offset that may be committed is always the smallest
offset still cached, so a message is never committed before it is consumed.

Orderly consumption takes messages into a separate "consuming" table and commits or puts
them back as one batch. Threads: the pull thread and the consume threads share an instance;
every method takes its lock.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Generic, Protocol, TypeVar


class Pulled(Protocol):
    """What the queue needs of a message: its queue offset and body."""

    @property
    def queue_offset(self) -> int: ...

    @property
    def body(self) -> bytes: ...


M = TypeVar("M", bound=Pulled)

PULL_MAX_IDLE_S = 120.0
"""A queue not pulled for this long is considered stuck (RocketMQ's pullMaxIdleTime)."""
REBALANCE_LOCK_MAX_LIVE_S = 30.0
"""A broker queue lock not renewed for this long is treated as lost (orderly), at most."""
LOCK_LEASE_SHARE = 0.5
"""A client counts a lock held for this share of the broker's expiry (RocketMQ: 30 s of
60 s), so its own lease ends well before the broker lets anyone else take the queue: a
renewal that fails leaves the queue consumed for the rest of the lease, never past it."""


def lock_lease_s(broker_expiry_s: float) -> float:
    """How long after a lock or renewal the client still counts the lock its own."""
    return min(REBALANCE_LOCK_MAX_LIVE_S, broker_expiry_s * LOCK_LEASE_SHARE)


class ProcessQueue(Generic[M]):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offsets: list[int] = []  # sorted keys of _messages
        self._messages: dict[int, M] = {}
        self._consuming: dict[int, M] = {}  # orderly: taken, not yet committed
        self._bytes = 0
        self._max_offset = -1  # highest offset ever put
        self.dropped = False
        """Set when the queue is taken away by a rebalance: consumers stop and discard."""
        self.locked = False
        """Orderly: whether this client holds the broker's lock on the queue."""
        self.last_lock_at = 0.0
        self.lock_lease_s = REBALANCE_LOCK_MAX_LIVE_S
        """Orderly: how long after `last_lock_at` the lock counts as held (lock_lease_s)."""
        self.last_pull_at = time.monotonic()
        self.consume_lock = threading.Lock()
        """Orderly: held while a batch is consumed, so a rebalance waits before it drops."""

    def is_dropped(self) -> bool:
        """`dropped`, read afresh: another thread may have set it since the last look."""
        return self.dropped

    # -- the pull side -------------------------------------------------------------------

    def put(self, messages: Iterable[M]) -> int:
        """Cache pulled messages (ones already cached are ignored); return how many were new."""
        added = 0
        with self._lock:
            for m in messages:
                offset = m.queue_offset
                if offset in self._messages or offset in self._consuming:
                    continue
                self._messages[offset] = m
                if not self._offsets or offset > self._offsets[-1]:
                    self._offsets.append(offset)
                else:
                    bisect.insort(self._offsets, offset)
                self._bytes += len(m.body)
                self._max_offset = max(self._max_offset, offset)
                added += 1
        return added

    @property
    def count(self) -> int:
        """Messages cached and not yet consumed (including those taken by orderly)."""
        with self._lock:
            return len(self._messages) + len(self._consuming)

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._bytes

    @property
    def span(self) -> int:
        """Highest minus lowest cached offset (0 when fewer than two are cached)."""
        with self._lock:
            return self._offsets[-1] - self._offsets[0] if self._offsets else 0

    def pull_expired(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) - self.last_pull_at > PULL_MAX_IDLE_S

    def lock_expired(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return now - self.last_lock_at > self.lock_lease_s

    # -- the concurrent consume side -----------------------------------------------------

    def remove(self, messages: Iterable[M]) -> int:
        """Forget consumed messages; return the offset that may now be committed: the
        smallest still cached, or one past the highest ever cached when none is left.
        Returns -1 if nothing was ever cached."""
        with self._lock:
            for m in messages:
                if self._messages.pop(m.queue_offset, None) is not None:
                    at = bisect.bisect_left(self._offsets, m.queue_offset)
                    del self._offsets[at]
                    self._bytes -= len(m.body)
            return self._commit_point_locked()

    def _commit_point_locked(self) -> int:
        if self._consuming:
            return min(self._consuming)
        if self._offsets:
            return self._offsets[0]
        return self._max_offset + 1 if self._max_offset >= 0 else -1

    # -- the orderly consume side --------------------------------------------------------

    def take(self, batch: int) -> list[M]:
        """Orderly: move the `batch` lowest cached messages into the consuming table."""
        with self._lock:
            taken_offsets = self._offsets[:batch]
            del self._offsets[:batch]
            taken = [self._messages.pop(o) for o in taken_offsets]
            for o, m in zip(taken_offsets, taken, strict=True):
                self._consuming[o] = m
            return taken

    def commit(self) -> int:
        """Orderly: the taken batch is consumed; return the offset to commit (one past the
        highest taken), or -1 if nothing was taken."""
        with self._lock:
            if not self._consuming:
                return -1
            highest = max(self._consuming)
            self._bytes -= sum(len(m.body) for m in self._consuming.values())
            self._consuming.clear()
            return highest + 1

    def put_back(self, messages: Sequence[M]) -> None:
        """Orderly (SUSPEND_CURRENT_QUEUE_A_MOMENT): return taken messages to be consumed
        again, in offset order, before anything later."""
        with self._lock:
            for m in messages:
                if self._consuming.pop(m.queue_offset, None) is not None:
                    self._messages[m.queue_offset] = m
                    bisect.insort(self._offsets, m.queue_offset)
