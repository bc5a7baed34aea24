"""Where a consumer keeps how far it has consumed each queue (seed 001).

Both stores hold offsets in memory and write them down in the background: every 5 s, when
a queue is taken away, and at shutdown. In memory an offset only moves forward
(`increase_only`), so a late update from a slow consume thread never undoes a newer one;
`seek` and an illegal-offset correction move it anywhere.

- `RemoteOffsetStore` (clustering): the broker group of each queue keeps the group's offset.
- `LocalFileOffsetStore` (broadcasting): every client keeps its own in a JSON file,
  replaced atomically (write, fsync, rename, fsync the directory), so a crash leaves the
  old file or the new one, never a torn one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from capstan.client.consumer.broker_calls import BrokerCalls
from capstan.client.consumer.message_queue import RETRY_PREFIX, MessageQueue
from capstan.client.consumer.queue_replicas import QueueReplicas
from capstan.client.consumer.settings import ConsumeFromWhere, ConsumerOptions
from capstan.client.errors import ClientError

log = logging.getLogger(__name__)

PERSIST_INTERVAL_S = 5.0
"""How often offsets are written down (RocketMQ's persistConsumerOffsetInterval)."""


class Droppable(Protocol):
    dropped: bool


class OffsetStore(Protocol):
    def update(self, queue: MessageQueue, offset: int, increase_only: bool = True) -> None: ...

    def update_unless_dropped(self, queue: MessageQueue, offset: int, pq: Droppable) -> None: ...

    def forget(self, queue: MessageQueue, pq: Droppable | None) -> None: ...

    def read(self, queue: MessageQueue, from_store: bool = False) -> int:
        """The offset to consume next, or -1 when there is none."""
        ...

    def persist(self, queues: Iterable[MessageQueue]) -> None: ...

    def remove(self, queue: MessageQueue) -> None: ...


class _MemoryOffsets:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offsets: dict[MessageQueue, int] = {}

    def update(self, queue: MessageQueue, offset: int, increase_only: bool = True) -> None:
        if offset < 0:
            return
        with self._lock:
            old = self._offsets.get(queue, -1)
            if not increase_only or offset > old:
                self._offsets[queue] = offset

    def update_unless_dropped(self, queue: MessageQueue, offset: int, pq: Droppable) -> None:
        """Raise the offset of a batch just consumed, unless its ProcessQueue was dropped:
        checked under the lock `forget` drops it with, so a batch that finishes while its
        queue is taken away cannot bring an old offset back."""
        with self._lock:
            if not pq.dropped and offset > self._offsets.get(queue, -1):
                self._offsets[queue] = offset

    def forget(self, queue: MessageQueue, pq: Droppable | None) -> None:
        """Mark `pq` dropped and drop the queue's offset, in one step."""
        with self._lock:
            if pq is not None:
                pq.dropped = True
            self._offsets.pop(queue, None)

    def memory(self, queue: MessageQueue) -> int:
        with self._lock:
            return self._offsets.get(queue, -1)

    def snapshot(self, queues: Iterable[MessageQueue] | None = None) -> dict[MessageQueue, int]:
        with self._lock:
            if queues is None:
                return dict(self._offsets)
            return {q: self._offsets[q] for q in queues if q in self._offsets}

    def remove(self, queue: MessageQueue) -> None:
        with self._lock:
            self._offsets.pop(queue, None)


class RemoteOffsetStore(_MemoryOffsets):
    """Offsets kept by the broker groups (clustering): read from and committed to the
    replica each queue's group serves on now (`queue_replicas.py`), which passes them on to
    its master."""

    def __init__(self, calls: BrokerCalls, replicas: QueueReplicas) -> None:
        super().__init__()
        self._calls = calls
        self._replicas = replicas
        self._persisting = threading.Lock()  # one commit at a time, and none during a reassert

    def read(self, queue: MessageQueue, from_store: bool = False) -> int:
        if not from_store:
            found = self.memory(queue)
            if found >= 0:
                return found
        offset = self._replicas.call(
            queue, "offset query", lambda address: self._calls.query_offset(address, queue)
        )
        if offset >= 0:
            self.update(queue, offset, increase_only=False)
        return offset

    def persist(self, queues: Iterable[MessageQueue]) -> None:
        """Commit the offsets of `queues` to their broker groups, one call per group."""
        with self._persisting:
            self._commit(self.snapshot(queues))

    def reassert(self, offsets: dict[MessageQueue, int]) -> None:
        """An admin reset these offsets on their broker group, and they are forgotten
        here. A commit taken from memory before that may have reached the broker after the
        reset and undone it: wait for any commit in flight, then write the reset offsets
        again, so the reset is what the broker keeps."""
        with self._persisting:
            self._commit(offsets)

    def _commit(self, offsets: dict[MessageQueue, int]) -> None:
        def commit(address: str, queues: list[MessageQueue]) -> None:
            self._calls.commit_offsets(address, {q: offsets[q] for q in queues})

        answers = self._replicas.call_each_group(list(offsets), "offset commit", commit)
        for group, answer in answers.items():
            if isinstance(answer, ClientError):
                log.warning("could not commit offsets to group %s: %s", group, answer)


class LocalFileOffsetStore(_MemoryOffsets):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._write_lock = threading.Lock()
        self._stored: dict[MessageQueue, int] = {}  # as the file has them
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
            for row in data["offsets"]:
                queue = MessageQueue(str(row["topic"]), str(row["broker"]), int(row["queue_id"]))
                self._stored[queue] = int(row["offset"])
            for queue, offset in self._stored.items():
                self.update(queue, offset, increase_only=False)
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Not fatal: the consumer starts these queues from its consume-from setting.
            log.error("offset file %s is unreadable (%s); ignoring it", self.path, exc)

    def read(self, queue: MessageQueue, from_store: bool = False) -> int:
        if from_store:
            with self._write_lock:
                offset = self._stored.get(queue, -1)
            if offset >= 0:
                self.update(queue, offset, increase_only=False)
            return offset
        return self.memory(queue)

    def persist(self, queues: Iterable[MessageQueue] | None = None) -> None:
        """Write every known offset (the file holds them all, not only `queues`)."""
        with self._write_lock:
            self._stored.update(self.snapshot())
            rows = [
                {"topic": q.topic, "broker": q.broker_name, "queue_id": q.queue_id, "offset": o}
                for q, o in sorted(self._stored.items())
            ]
            text = json.dumps({"offsets": rows}, indent=1)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temp = self.path.with_name(self.path.name + ".tmp")
            with open(temp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, self.path)
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)


def start_offset(
    offsets: OffsetStore,
    calls: BrokerCalls,
    options: ConsumerOptions,
    queue: MessageQueue,
    replicas: QueueReplicas,
) -> int:
    """Where a newly taken queue starts (seed 001): the committed offset, else where
    `consume_from_where` says; a retry topic always from its first message."""
    committed = offsets.read(queue, from_store=True)
    if committed >= 0:
        return committed
    low, high = replicas.call(
        queue, "queue bounds", lambda address: calls.queue_bounds(address, queue)
    )
    where = options.consume_from_where
    if queue.topic.startswith(RETRY_PREFIX) or where is ConsumeFromWhere.FIRST_OFFSET:
        return low
    if where is ConsumeFromWhere.LAST_OFFSET:
        return high
    stamp = options.consume_timestamp_ms
    found = replicas.call(
        queue, "offset search", lambda address: calls.search_offset(address, queue, stamp)
    )
    return max(low, found)
