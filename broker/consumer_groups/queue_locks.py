"""Broker-side queue locks for orderly consumption (RocketMQ's RebalanceLockManager).

A queue of a group is locked by at most one client at a time. The holder renews the lock
by locking again; a lock not renewed for the expiry time lapses and anyone may take it.
Lock and unlock are all-or-nothing per queue: a request for several queues gets the ones
it could take.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

QueueKey = tuple[str, int]
"""(topic, queue id)"""


@dataclass
class _Lock:
    client_id: str
    renewed_at: float


class QueueLocks:
    """Use from the broker's event loop only."""

    def __init__(self, expiry_s: float) -> None:
        self.expiry_s = expiry_s
        self._locks: dict[str, dict[QueueKey, _Lock]] = {}
        self.version = 0
        """Rises with every lock, renewal and release (what a master sends its slaves on)."""

    def _live(self, lock: _Lock | None, now: float) -> bool:
        return lock is not None and now - lock.renewed_at <= self.expiry_s

    def lock(
        self, group: str, client_id: str, queues: Iterable[QueueKey], now: float | None = None
    ) -> list[QueueKey]:
        """Take or renew each queue's lock for `client_id`; the queues it now holds."""
        now = time.monotonic() if now is None else now
        self.version += 1
        table = self._locks.setdefault(group, {})
        held = []
        for key in queues:
            current = table.get(key)
            if current is not None and current.client_id == client_id:
                current.renewed_at = now
            elif self._live(current, now):
                continue
            else:
                table[key] = _Lock(client_id, now)
            held.append(key)
        return held

    def unlock(self, group: str, client_id: str, queues: Iterable[QueueKey]) -> None:
        self.version += 1
        table = self._locks.get(group, {})
        for key in queues:
            current = table.get(key)
            if current is not None and current.client_id == client_id:
                del table[key]

    def release_client(self, group: str, client_id: str) -> int:
        """Drop every lock `client_id` holds in `group` (it left); how many."""
        table = self._locks.get(group, {})
        mine = [key for key, lock in table.items() if lock.client_id == client_id]
        for key in mine:
            del table[key]
        self.version += 1
        return len(mine)

    def holder(self, group: str, key: QueueKey, now: float | None = None) -> str | None:
        now = time.monotonic() if now is None else now
        lock = self._locks.get(group, {}).get(key)
        return lock.client_id if lock is not None and self._live(lock, now) else None

    def export(self, now: float | None = None) -> dict[str, list[list[Any]]]:
        """The live locks as JSON: per group, [topic, queue id, holder, seconds since the
        holder last renewed] (a copy elsewhere keeps each lock's remaining time)."""
        now = time.monotonic() if now is None else now
        out: dict[str, list[list[Any]]] = {}
        for group, table in self._locks.items():
            live = [
                [topic, qid, lock.client_id, round(now - lock.renewed_at, 3)]
                for (topic, qid), lock in table.items()
                if self._live(lock, now)
            ]
            if live:
                out[group] = live
        return out

    def replace_all(self, document: dict[str, list[list[Any]]], now: float | None = None) -> None:
        """Hold exactly the locks of `document` (what `export` wrote elsewhere)."""
        now = time.monotonic() if now is None else now
        locks: dict[str, dict[QueueKey, _Lock]] = {}
        for group, entries in document.items():
            table = locks.setdefault(group, {})
            for topic, qid, client_id, age in entries:
                table[str(topic), int(qid)] = _Lock(str(client_id), now - float(age))
        self._locks = locks
        self.version += 1
