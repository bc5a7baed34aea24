"""The remote offset store's ordering around an admin reset: a commit taken from memory
before the reset must not be the last word, and a batch finishing while its queue is
dropped must not bring its old offset back."""

from __future__ import annotations

import threading

from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.offset_store import RemoteOffsetStore
from capstan.client.consumer.process_queue import ProcessQueue
from tests.client.one_replica import OneReplica

Q = MessageQueue("T", "broker-a", 0)


class SlowBroker:
    """Stands in for the broker's CommitOffsets: keeps the commits in arrival order; the
    first one waits until the test lets it go, like a call delayed on the network."""

    def __init__(self) -> None:
        self.commits: list[dict[MessageQueue, int]] = []
        self.first_started = threading.Event()
        self.release_first = threading.Event()

    def commit_offsets(self, address: str, offsets: dict[MessageQueue, int]) -> None:
        if not self.first_started.is_set():
            self.first_started.set()
            assert self.release_first.wait(5)
        self.commits.append(dict(offsets))


def test_a_reassert_lands_after_a_commit_that_was_in_flight():
    broker = SlowBroker()
    store = RemoteOffsetStore(broker, OneReplica())  # type: ignore[arg-type]
    store.update(Q, 20)
    persisting = threading.Thread(target=store.persist, args=([Q],))
    persisting.start()
    assert broker.first_started.wait(5)  # the old offset is on its way
    store.forget(Q, None)  # the admin reset reached this member
    reasserting = threading.Thread(target=store.reassert, args=({Q: 0},))
    reasserting.start()
    reasserting.join(0.2)
    assert reasserting.is_alive()  # it waits for the commit in flight
    broker.release_first.set()
    persisting.join(5)
    reasserting.join(5)
    assert broker.commits == [{Q: 20}, {Q: 0}]  # the reset is what the broker keeps
    store.persist([Q])
    assert len(broker.commits) == 2  # memory holds no offset of Q to commit over the reset


def test_a_batch_finishing_after_its_queue_is_forgotten_leaves_no_offset():
    store = RemoteOffsetStore(SlowBroker(), OneReplica())  # type: ignore[arg-type]
    old: ProcessQueue[object] = ProcessQueue()
    store.update_unless_dropped(Q, 10, old)
    assert store.read(Q) == 10
    store.forget(Q, old)
    assert old.dropped
    store.update_unless_dropped(Q, 30, old)  # the batch that was running
    assert store.memory(Q) == -1
    new: ProcessQueue[object] = ProcessQueue()
    store.update_unless_dropped(Q, 5, new)
    assert store.memory(Q) == 5
