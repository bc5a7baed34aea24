"""The master's side of capstan.v1.Replication: one stream per following slave.

After the slave's Follow, the master finds where their logs stop agreeing (epoch
histories, `find_consistent_offset`) and tells the slave where to cut and copy from. It then
sends the CommitLog as it grows, whole records per chunk, the group's metadata when it
changes, and a Beat every half second when there is nothing else; the slave's acks, read on a
task of their own, settle the writes waiting in the ReplicaGroup.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from capstan.broker.replication.epoch_file import EpochEntry, find_consistent_offset
from capstan.broker.replication.replica_group import ReplicaGroup, SlaveLink
from capstan.broker.replication.state_copy import BrokerStateCopy, Versions
from capstan.broker.store.record import CorruptRecord
from capstan.common.grpc_abort import abort
from capstan.v1 import replication_pb2 as pb
from capstan.v1 import replication_pb2_grpc as pb_grpc

COMPACTED_CHUNK_BYTES = 1024 * 1024

log = logging.getLogger(__name__)

BEAT_INTERVAL_S = 0.5
"""A slave hears from its master at least this often; one that hears nothing for
slave_stream.MASTER_SILENT_S reports it silent."""


def epoch_ranges(entries: tuple[EpochEntry, ...]) -> list[pb.EpochRange]:
    return [pb.EpochRange(epoch=e.epoch, start_offset=e.start_offset) for e in entries]


def start_point(group: ReplicaGroup, follow: pb.Follow) -> tuple[int, int]:
    """(truncate_to or -1, copy_from) for a slave described by `follow`."""
    store = group.store
    mine, my_end = group.epochs.entries(), store.max_phys_offset
    theirs = tuple(EpochEntry(r.epoch, r.start_offset) for r in follow.epochs)
    if follow.max_offset == 0:
        return -1, store.min_phys_offset
    agreed = find_consistent_offset(theirs, follow.max_offset, mine, my_end)
    if agreed is None or agreed < store.min_phys_offset:
        return 0, store.min_phys_offset  # nothing vouched for (or no longer here): start over
    return (agreed if agreed < follow.max_offset else -1), agreed


async def _same_group(group: ReplicaGroup, broker_name: str, context: Any) -> None:
    """INVALID_ARGUMENT for a slave of another group."""
    if broker_name != group.broker_name:
        await abort(
            context,
            grpc.StatusCode.INVALID_ARGUMENT,
            f"this broker serves group {group.broker_name!r}, not {broker_name!r}",
        )


class ReplicationService(pb_grpc.ReplicationServicer):
    """`group` is None on a standalone broker, which refuses every stream."""

    def __init__(self, group: ReplicaGroup | None, state: BrokerStateCopy | None) -> None:
        self._group = group
        self._state = state

    async def Replicate(
        self, request_iterator: AsyncIterator[pb.ReplicaToMaster], context: Any
    ) -> AsyncIterator[pb.MasterToReplica]:
        if self._group is None:
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "this broker runs standalone (replication.role); it has no slaves",
            )
        group = self._group
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("kind") != "follow":
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "open with a Follow message")
        follow = first.follow
        await self._check(follow, context)
        truncate_to, copy_from = start_point(group, follow)
        link = group.slave_connected(
            follow.broker_id, follow.address, copy_from if truncate_to < 0 else truncate_to
        )
        acks = asyncio.create_task(self._read_acks(request_iterator, link))
        try:
            yield pb.MasterToReplica(
                start=pb.StartCopy(
                    master_epoch=group.master_epoch,
                    master_id=group.broker_id,
                    truncate_to=truncate_to,
                    copy_from=copy_from,
                    epochs=epoch_ranges(group.epochs.entries()),
                )
            )
            async for message in self._send_from(copy_from, acks, link):
                yield message
        finally:
            acks.cancel()
            group.slave_gone(link)

    async def FetchCompacted(
        self, request: pb.FetchCompactedRequest, context: Any
    ) -> AsyncIterator[pb.CompactedFile]:
        """A compacted copy for a slave: CURRENT first, then its files in chunks."""
        if self._group is None:
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION, "this broker has no slaves")
        assert self._group is not None
        compacted = self._group.store.compacted
        try:
            current, files = compacted.current_files(request.topic, request.generation)
            yield pb.CompactedFile(current_json=current.decode())
            for path in files:
                data = await asyncio.to_thread(path.read_bytes)
                for at in range(0, max(len(data), 1), COMPACTED_CHUNK_BYTES):
                    chunk = data[at : at + COMPACTED_CHUNK_BYTES]
                    yield pb.CompactedFile(name=path.name, offset=at, data=chunk)
        except (ValueError, OSError) as exc:  # replaced meanwhile: the slave asks again
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    async def FetchRecord(
        self, request: pb.FetchRecordRequest, context: Any
    ) -> pb.FetchRecordReply:
        """The record at an offset, as stored here, for a slave whose copy is damaged."""
        group = self._group
        if group is None:
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION, "this broker has no slaves")
        assert group is not None
        await _same_group(group, request.broker_name, context)
        store = group.store
        if request.offset < store.min_phys_offset:
            await abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"offset {request.offset} is below this log's oldest ({store.min_phys_offset})",
            )
        if request.offset >= store.max_phys_offset:
            await abort(
                context,
                grpc.StatusCode.OUT_OF_RANGE,
                f"offset {request.offset} is past this log's end ({store.max_phys_offset})",
            )
        try:
            record = await asyncio.to_thread(store.sound_record, request.offset)
        except CorruptRecord as exc:
            log.error("a slave asked for a record this master holds damaged: %s", exc)
            await abort(context, grpc.StatusCode.DATA_LOSS, f"this master's copy too: {exc}")
        return pb.FetchRecordReply(record=record)

    async def _check(self, follow: pb.Follow, context: Any) -> None:
        group = self._group
        assert group is not None
        await _same_group(group, follow.broker_name, context)
        if follow.segment_bytes != group.store.settings.commitlog_segment_bytes:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"CommitLog segments differ: {follow.segment_bytes} here "
                f"{group.store.settings.commitlog_segment_bytes}",
            )
        if not group.is_master or follow.broker_id == group.broker_id:
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"broker {group.broker_id} of {group.broker_name} is not its master",
            )
        if follow.master_epoch > group.master_epoch:
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"deposed: the slave follows epoch {follow.master_epoch}, this master leads "
                f"epoch {group.master_epoch}",
            )

    async def _read_acks(
        self, request_iterator: AsyncIterator[pb.ReplicaToMaster], link: SlaveLink
    ) -> None:
        assert self._group is not None
        async for message in request_iterator:
            kind = message.WhichOneof("kind")
            if kind == "ack":
                self._group.slave_acked(link, message.ack.stored_offset, message.ack.flushed_offset)
                self._group.slave_damage(link, message.ack.damaged, message.ack.damaged_offset)
                if message.ack.metadata_sequence:
                    self._group.metadata_applied(link, message.ack.metadata_sequence)
                ack = message.ack
                if ack.whole_state_wanted and ack.metadata_sequence >= link.whole_sent:
                    link.whole_wanted = True  # not again for acks before the whole one came
            elif kind == "leave":
                self._group.slave_leaving(link)

    async def _send_from(
        self, offset: int, acks: asyncio.Task[None], link: SlaveLink
    ) -> AsyncIterator[pb.MasterToReplica]:
        group = self._group
        assert group is not None
        store = group.store
        loop = asyncio.get_running_loop()
        state = self._state
        assert state is not None
        versions: Versions | None = None
        next_metadata = 0.0
        interval = group.settings.metadata_interval_ms / 1000
        nudges = group.catalog_nudges
        sequence = 0
        beat_at, beat_confirm = 0.0, -1
        while not acks.done() and group.is_master and not group.stopping:
            now = loop.time()
            # A nudge (a change the slaves should hold now) sends metadata at once, but
            # one at a time: the next waits for the slave to apply the last, so a slow or
            # stopped slave finds one message waiting, not one per receive.
            nudged = nudges != group.catalog_nudges and not link.catalog_sent
            if now >= next_metadata or nudged or link.whole_wanted:
                next_metadata = now + interval
                nudges = group.catalog_nudges
                if link.whole_wanted:
                    link.whole_wanted = False
                    versions = None
                current = state.versions()
                if current != versions:
                    if store.max_phys_offset > offset:
                        # Writes wait behind this metadata: a slave that stopped reading
                        # blocks the stream here, and must count as stalled all the same.
                        group.chunk_sent(link)
                    sequence += 1
                    metadata = state.metadata(versions, current)
                    metadata.sequence = sequence
                    link.catalog_sent[sequence] = tuple(current)
                    if versions is None:
                        link.whole_sent = sequence
                    yield pb.MasterToReplica(metadata=metadata)
                    versions = current
            data, after = store.read_for_replica(offset, group.settings.chunk_bytes)
            if data:
                group.chunk_sent(link)
                yield pb.MasterToReplica(
                    chunk=pb.LogChunk(offset=offset, data=data, confirm_offset=group.confirm_offset)
                )
                offset = after
                continue
            # A beat tells the slave where the log and the confirm offset are, and that the
            # master lives: owed when the confirm offset moved or BEAT_INTERVAL_S passed, not
            # at every wake-up (each receive and ack wakes the stream for its metadata).
            if group.confirm_offset != beat_confirm or loop.time() >= beat_at + BEAT_INTERVAL_S:
                beat_at, beat_confirm = loop.time(), group.confirm_offset
                yield pb.MasterToReplica(
                    beat=pb.Beat(
                        master_max_offset=store.max_phys_offset, confirm_offset=beat_confirm
                    )
                )
            next_beat_s = beat_at + BEAT_INTERVAL_S - loop.time()
            await group.wait_appended(offset, max(0.0, min(next_beat_s, interval)))
        if acks.done() and not acks.cancelled() and acks.exception() is not None:
            log.warning("slave stream ended: %s", acks.exception())
