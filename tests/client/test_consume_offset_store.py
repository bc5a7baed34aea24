"""The offset stores' increase-only rule (seed 002), one contract over both backends: in
memory a lower offset never replaces a higher one, whichever thread reports it and in
whatever order, so what is written down is the highest reported. Only the explicit paths
move an offset back: `update(..., increase_only=False)` (seek, illegal-offset correction)
and `remove` (a queue taken up afresh)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.offset_store import LocalFileOffsetStore, RemoteOffsetStore
from capstan.client.consumer.process_queue import ProcessQueue
from tests.client.one_replica import OneReplica

Q = MessageQueue("T", "broker-a", 0)
OTHER = MessageQueue("T", "broker-a", 1)


class BrokerOffsets:
    """Stands in for the broker's CommitOffsets / QueryOffset (the remote store's calls)."""

    def __init__(self) -> None:
        self.committed: dict[MessageQueue, int] = {}

    def commit_offsets(self, address: str, offsets: dict[MessageQueue, int]) -> None:
        self.committed.update(offsets)

    def query_offset(self, address: str, queue: MessageQueue) -> int:
        return self.committed.get(queue, -1)


Store = RemoteOffsetStore | LocalFileOffsetStore


@pytest.fixture(params=["remote", "local_file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "remote":
        yield RemoteOffsetStore(BrokerOffsets(), OneReplica())  # type: ignore[arg-type]
    else:
        yield LocalFileOffsetStore(tmp_path / "offsets.json")


def written(store: Store, queue: MessageQueue) -> int:
    """The offset as the store wrote it down (the broker's, or the file's)."""
    store.persist([queue])
    if isinstance(store, RemoteOffsetStore):
        return store._calls.committed.get(queue, -1)  # type: ignore[attr-defined,no-any-return]
    return LocalFileOffsetStore(store.path).read(queue, from_store=True)


def test_a_lower_offset_never_replaces_a_higher_one(store: Store):
    store.update(Q, 10)
    store.update(Q, 7)
    store.update(Q, 10)
    assert store.read(Q) == 10
    store.update(Q, 11)
    assert store.read(Q) == 11
    assert written(store, Q) == 11


def test_a_batch_finishing_late_does_not_move_the_offset_back(store: Store):
    pq: ProcessQueue[object] = ProcessQueue()
    store.update_unless_dropped(Q, 40, pq)  # a later batch finished first
    store.update_unless_dropped(Q, 32, pq)  # an earlier one, slower, finishes now
    assert store.read(Q) == 40
    assert written(store, Q) == 40


def test_a_negative_offset_is_ignored(store: Store):
    store.update(Q, 5)
    store.update(Q, -1)
    store.update(Q, -1, increase_only=False)
    assert store.read(Q) == 5


def test_queues_are_independent(store: Store):
    store.update(Q, 100)
    store.update(OTHER, 3)
    assert (store.read(Q), store.read(OTHER)) == (100, 3)


def test_only_the_explicit_paths_move_an_offset_back(store: Store):
    store.update(Q, 50)
    store.update(Q, 20, increase_only=False)  # seek / illegal-offset correction
    assert store.read(Q) == 20
    assert written(store, Q) == 20
    store.update(Q, 60)
    store.remove(Q)  # the queue is taken up afresh
    store.update(Q, 8)
    assert store.memory(Q) == 8


def test_racing_threads_leave_the_highest_offset(store: Store):
    """Eight consume threads report 0..1999 in shuffled order; at every moment a reader
    sees the offset only grow, and the end state is the highest reported."""
    reports = list(range(2000))
    random.Random(4).shuffle(reports)
    chunks = [reports[n::8] for n in range(8)]
    stop = threading.Event()
    seen_backwards: list[tuple[int, int]] = []

    def watch() -> None:
        last = -1
        while not stop.is_set():
            now = store.memory(Q)
            if now < last:
                seen_backwards.append((last, now))
            last = now

    watcher = threading.Thread(target=watch)
    watcher.start()
    workers = [threading.Thread(target=lambda c=c: [store.update(Q, o) for o in c]) for c in chunks]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    watcher.join()
    assert seen_backwards == []
    assert store.read(Q) == 1999
    assert written(store, Q) == 1999
