"""What of a broker's state beyond its CommitLog a master sends its slaves (the Metadata
message), and how a slave takes it: topics, subscription groups, consumer offsets, pop
state, timer and transaction progress, queue locks, the receipt-handle key, and the
generations of compacted copies (a slave with an older copy fetches the master's:
slave_stream.py).

Each part has a version that rises when it changes; the master sends a part when its
version differs from the one last sent on that stream (everything on a new stream). The
slave stores each part as its own, durably, so once promoted it serves offsets, in-flight
pop messages and receipt handles as the master did, and its timer and transaction checks
go on from the master's progress (re-delivering at most what the master did after its
last progress record).

Without a controller the same document travels back: a slave that acted for an absent
master (slave-acting-master) hands the master what it changed (`taken_back`), and the
master adopts it before serving (`apply_files` and `apply_services` again).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from capstan.broker.consumer_groups.queue_locks import QueueLocks
from capstan.broker.pop.pop_state import PopState
from capstan.broker.pop.receipt_handle import HandleCodec
from capstan.broker.store.message_store import MessageStore
from capstan.broker.timer.timer_service import TimerService
from capstan.broker.transaction.transaction_service import TransactionService
from capstan.v1 import replication_pb2 as pb

Versions = tuple[int, ...]
"""topics, groups, consumer offsets, pop state, timer progress, transaction progress,
queue locks, compacted copies"""
_PARTS = 8
_MASTER_ONLY = (0, 1, 7)
"""Topics, groups and compacted copies: changed by the master alone, never taken back from
a slave."""


@dataclass
class BrokerStateCopy:
    store: MessageStore
    pop_state: PopState
    timer: TimerService
    transactions: TransactionService
    handles: HandleCodec
    locks: QueueLocks

    def versions(self) -> Versions:
        s = self.store
        return (
            s.topics.data_version,
            s.subscription_groups.data_version,
            s.consumer_offsets.data_version,
            self.pop_state.version,
            self.timer.recorded,
            self.transactions.version,
            self.locks.version,
            s.compacted.version,
        )

    def metadata(self, sent: Versions | None, current: Versions) -> pb.Metadata:
        """The parts whose versions moved since `sent` (all of them when None)."""
        changed = [sent is None or sent[i] != current[i] for i in range(len(current))]
        return self._parts(changed, handle_key=sent is None)

    def taken_back(self) -> pb.Metadata:
        """What an acting master changes, for the returning master: consumer offsets, pop
        state, timer and transaction progress and queue locks (not topics, groups or the
        handle key, which only a master changes)."""
        return self._parts([i not in _MASTER_ONLY for i in range(_PARTS)], handle_key=False)

    def _parts(self, changed: list[bool], handle_key: bool) -> pb.Metadata:
        s = self.store

        def doc(i: int, export: Callable[[], object]) -> str:
            return json.dumps(export()) if changed[i] else ""

        return pb.Metadata(
            topics_json=doc(0, s.topics.export),
            groups_json=doc(1, s.subscription_groups.export),
            consumer_offsets_json=doc(2, s.consumer_offsets.export),
            pop_state_json=doc(3, self.pop_state.export),
            timer_progress_json=doc(4, lambda: {"offset": self.timer.recorded}),
            transaction_progress_json=doc(5, self.transactions.progress),
            handle_key=self.handles.key if handle_key else b"",
            queue_locks_json=doc(6, self.locks.export),
            compacted_json=doc(7, s.compacted.generations),
        )

    def apply_files(self, metadata: pb.Metadata) -> None:
        """The slave's part that writes files only (run it on a worker thread)."""
        s = self.store
        if metadata.topics_json:
            s.topics.replace_all(json.loads(metadata.topics_json), "master's topics")
        if metadata.groups_json:
            s.subscription_groups.replace_all(
                json.loads(metadata.groups_json), "master's subscription groups"
            )
        if metadata.consumer_offsets_json:
            s.consumer_offsets.replace_all(
                json.loads(metadata.consumer_offsets_json), "master's consumer offsets"
            )
        if metadata.timer_progress_json:
            self.timer.adopt_progress(json.loads(metadata.timer_progress_json))
        if metadata.handle_key:
            self.handles.adopt_key(metadata.handle_key)

    def apply_services(self, metadata: pb.Metadata) -> None:
        """The slave's part that touches state the event loop owns (run it there)."""
        if metadata.pop_state_json:
            self.pop_state.replace_all(json.loads(metadata.pop_state_json))
        if metadata.transaction_progress_json:
            self.transactions.adopt_progress(json.loads(metadata.transaction_progress_json))
        if metadata.queue_locks_json:
            self.locks.replace_all(json.loads(metadata.queue_locks_json))
