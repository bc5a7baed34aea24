"""The slave's side of capstan.v1.Replication: follow the master over one stream.

The follower opens the stream with its epoch history and max offset, cuts its log back
where the master says, records each master epoch as that epoch's first bytes arrive,
stores every chunk at the master's offsets (dispatching it to the consume queues), and acks
what it holds. Metadata replaces its topics, groups and offsets. When the stream breaks, it
connects again after a pause, from wherever its log now ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

from capstan.broker.replication.epoch_file import EpochEntry
from capstan.broker.replication.master_stream import epoch_ranges
from capstan.broker.replication.replica_group import ReplicaGroup
from capstan.broker.replication.state_copy import BrokerStateCopy
from capstan.common.channel_pool import CONNECT_OPTIONS
from capstan.common.errors import ConfigError
from capstan.common.grpc_limits import MESSAGE_SIZE_OPTIONS
from capstan.security.peers import dial_peer, peer_security
from capstan.v1 import replication_pb2 as pb
from capstan.v1 import replication_pb2_grpc as pb_grpc

COMPACTED_FETCH_S = 120.0

log = logging.getLogger(__name__)

MASTER_SILENT_S = 1.0
"""A master sends something at least every half second (a Beat when idle): a slave that
has waited this long for its next message reports the master silent to the controller
(which replaces it only if it also answers no probe and its heartbeats stopped). The
stream stays open: a master that was only slow carries on."""
SILENCE_CHECK_S = 0.2
"""How often the slave looks at how long it has waited."""

FIRST_RETRY_S = 0.05
RETRY_S = 1.0
"""A broken stream is opened again after FIRST_RETRY_S, then after twice as long each
time up to RETRY_S: a master that has only just been elected refuses the first tries."""


class ReplicaFollower:
    def __init__(
        self,
        group: ReplicaGroup,
        own_address: str,
        state: BrokerStateCopy,
        on_stream_end: Callable[[], None] = lambda: None,
        keeps_own_state: Callable[[], bool] = lambda: False,
        on_master_silent: Callable[[], None] = lambda: None,
        damaged: Callable[[], list[int]] = list,
    ) -> None:
        self._group = group
        self._state = state
        self._own_address = own_address
        self._task: asyncio.Task[None] | None = None
        self._call: Any = None
        self._writing = asyncio.Lock()
        self._dispatching: asyncio.Future[None] | None = None
        """The dispatch of the last chunk copied, running on a thread."""
        self.connected = False
        self.master_max_offset = 0
        self._whole_wanted = False
        """This stream's Metadata was skipped (keeps_own_state): the parts that travel as
        changes are taken again once the master sends them whole."""
        self._metadata_sequence = 0
        """The last Metadata message applied on the current stream (acknowledged to the
        master, which answers admin changes once the in-sync slaves hold them)."""
        self.on_stream_end = on_stream_end
        """Called whenever the stream from the master ends: the controller may already
        have named another master (a handover), so the controller link asks at once."""
        self.keeps_own_state = keeps_own_state
        """While true, the master's metadata is not applied (a slave holding what it
        changed while acting for the master, until the master takes it back)."""
        self.on_master_silent = on_master_silent
        """Called when the master falls silent (MASTER_SILENT_S): the controller hears of
        it now, from the controller link."""
        self._reading_since: float | None = None
        """When the wait for the master's next message began; None while not waiting."""
        self.silent = False
        """Whether the master was reported silent and has not been heard from since."""
        self.last_heard: float | None = None
        """When (time.monotonic) the stream last answered: a message, or its end."""
        self._watch: asyncio.Task[None] | None = None
        self.damaged = damaged
        """Offsets of this replica's records that fail their checks, not mended yet: each
        ack says whether there are any (record_healer.py)."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="replica-follower")
        self._watch = asyncio.create_task(self._watch_silence(), name="replica-silence")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, self._watch) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = self._watch = None
        if self._dispatching is not None:  # its thread goes on: let it end first
            await asyncio.gather(self._dispatching, return_exceptions=True)
            self._dispatching = None

    async def _watch_silence(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SILENCE_CHECK_S)
            since = self._reading_since
            if since is None or self.silent or not self.connected:
                continue
            if loop.time() - since >= MASTER_SILENT_S:
                group = self._group
                self.silent = True
                group.master_lost_epoch = group.master_epoch
                log.warning(
                    "master %s (epoch %d) has sent nothing for %.1f s; telling the controller",
                    group.master_address,
                    group.master_epoch,
                    loop.time() - since,
                )
                self.on_master_silent()

    def _heard(self) -> None:
        """A message came: a master reported silent spoke again."""
        self._reading_since = None
        self.last_heard = time.monotonic()
        if self.silent:
            self.silent = False
            group = self._group
            if group.master_lost_epoch == group.master_epoch:
                group.master_lost_epoch = 0
            log.info("master %s is heard again", group.master_address)

    async def _run(self) -> None:
        retry_s = FIRST_RETRY_S
        while True:
            address = self._group.master_address
            if not address:
                return  # the group has no master to follow for now
            try:
                await self._follow(address)
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "replication from %s ended: %s %s", address, exc.code().name, exc.details()
                )
                if (
                    exc.code() is grpc.StatusCode.UNAVAILABLE
                    and address == self._group.master_address
                ):
                    # Refused or reset: its process or machine may be gone. The controller
                    # hears of it now (on_stream_end below) and checks.
                    self._group.master_lost_epoch = self._group.master_epoch
            except (OSError, ValueError, ConfigError) as exc:
                log.error("replication from %s failed: %s", address, exc)
            finally:
                if self.connected:
                    retry_s = FIRST_RETRY_S  # it was up: start the backoff afresh
                self.connected = False
                self.on_stream_end()
            await asyncio.sleep(retry_s)
            retry_s = min(RETRY_S, retry_s * 2)

    async def _follow(self, address: str) -> None:
        group = self._group
        self._metadata_sequence = 0
        self._whole_wanted = False
        store = group.store
        follow = pb.ReplicaToMaster(
            follow=pb.Follow(
                broker_name=group.broker_name,
                broker_id=group.broker_id,
                address=self._own_address,
                master_epoch=group.master_epoch,
                max_offset=store.max_phys_offset,
                epochs=epoch_ranges(group.epochs.entries()),
                segment_bytes=store.settings.commitlog_segment_bytes,
            )
        )
        async with dial_peer(address, [*MESSAGE_SIZE_OPTIONS, *CONNECT_OPTIONS]) as channel:
            stub = pb_grpc.ReplicationStub(channel)  # type: ignore[no-untyped-call]
            call = stub.Replicate(metadata=peer_security().signature())
            try:
                await call.write(follow)
                self._call = call
                await self._copy(call, address)
            finally:
                self._call = None
                call.cancel()

    async def _copy(self, call: Any, address: str) -> None:
        group = self._group
        pending: list[EpochEntry] = []
        loop = asyncio.get_running_loop()
        while True:
            self._reading_since = loop.time()
            try:
                message = await call.read()
            finally:
                self._heard()
            if message is grpc.aio.EOF:
                return
            kind = message.WhichOneof("kind")
            if kind == "start":
                await self._dispatched()
                pending = await self._start(message.start)
                self.connected = True
                group.master_lost_epoch = 0
                log.info(
                    "following master %d of %s at %s (epoch %d) from offset %d",
                    message.start.master_id,
                    group.broker_name,
                    address,
                    message.start.master_epoch,
                    message.start.copy_from,
                )
            elif kind == "chunk":
                await self._dispatched()
                pending = await self._store_chunk(message.chunk, pending)
                await self._write(call, self._ack())
                # Held once written, as RocketMQ's slaves report: the queues and the index
                # follow on a thread, while the next chunk comes (a promotion dispatches
                # whatever is left).
                self._dispatching = asyncio.ensure_future(self._dispatch())
            elif kind == "metadata":
                if self.keeps_own_state():
                    self._whole_wanted = True
                    continue
                if self._state.holds_whole(message.metadata):
                    self._whole_wanted = False
                elif self._whole_wanted:
                    # Changes to a state this replica does not hold as the master last
                    # sent it: dropped, and the ack asks for the whole, which comes next.
                    self._state.drop_changes(message.metadata)
                if self._state.writes_files(message.metadata):
                    await asyncio.to_thread(self._state.apply_files, message.metadata)
                self._state.apply_services(message.metadata)
                if message.metadata.compacted_json:
                    await self._fetch_compacted(address, message.metadata.compacted_json)
                self._metadata_sequence = message.metadata.sequence
                await self._write(call, self._ack())
            elif kind == "beat":
                self.master_max_offset = message.beat.master_max_offset
                group.learn_confirm(message.beat.confirm_offset)
                await self._write(call, self._ack())

    async def _fetch_compacted(self, address: str, generations_json: str) -> None:
        """Fetch and install the master's compacted copy of each topic where this replica's
        is older (it missed a compaction, or started empty after the master's reclaimed
        the CommitLog under it). A failure is logged; the next metadata tries again."""
        compacted = self._group.store.compacted
        for topic, generation in sorted(json.loads(generations_json).items()):
            if generation <= compacted.generation(topic):
                continue
            try:
                document, files = await self._download(address, topic, int(generation))
                adopted = await asyncio.to_thread(compacted.adopt, topic, document, files)
            except (grpc.aio.AioRpcError, OSError, ValueError, KeyError) as exc:
                log.warning("compacted copy of %s from %s not taken: %s", topic, address, exc)
                continue
            if adopted:
                log.info("took the master's compacted copy of %s (gen %s)", topic, generation)

    async def _download(
        self, address: str, topic: str, generation: int
    ) -> tuple[dict[str, Any], dict[str, bytes]]:
        document: dict[str, Any] = {}
        parts: dict[str, bytearray] = {}
        async with dial_peer(address, [*MESSAGE_SIZE_OPTIONS, *CONNECT_OPTIONS]) as channel:
            stub = pb_grpc.ReplicationStub(channel)  # type: ignore[no-untyped-call]
            request = pb.FetchCompactedRequest(topic=topic, generation=generation)
            pieces = stub.FetchCompacted(
                request, timeout=COMPACTED_FETCH_S, metadata=peer_security().signature()
            )
            async for piece in pieces:
                if piece.current_json:
                    document = json.loads(piece.current_json)
                    continue
                data = parts.setdefault(piece.name, bytearray())
                if piece.offset != len(data):
                    raise ValueError(f"{piece.name}: chunk at {piece.offset}, not {len(data)}")
                data.extend(piece.data)
        if not document:
            raise ValueError("the master sent no CURRENT document")
        return document, {name: bytes(data) for name, data in parts.items()}

    async def _start(self, start: pb.StartCopy) -> list[EpochEntry]:
        group = self._group
        store = group.store
        if start.truncate_to >= 0:
            log.warning(
                "cutting this replica's log from %d back to %d, where it last agreed with "
                "master %d",
                store.max_phys_offset,
                start.truncate_to,
                start.master_id,
            )
            await asyncio.to_thread(store.truncate_log, start.truncate_to)
            group.confirm_offset = min(group.confirm_offset, start.truncate_to)
            group.epochs.truncate_from(start.truncate_to)  # after the log: see epoch_file.py
        group.master_epoch = max(group.master_epoch, start.master_epoch)
        mine = {e.epoch for e in group.epochs.entries()}
        pending = [
            EpochEntry(r.epoch, r.start_offset)
            for r in start.epochs
            if r.epoch not in mine and (not mine or r.epoch > max(mine))
        ]
        # An epoch that starts where this log ends (a master that has not written yet) is
        # recorded now: this replica holds everything before it, and its heartbeats should
        # say so rather than wait for the epoch's first bytes.
        end = store.max_phys_offset
        while pending and pending[0].start_offset <= end:
            entry = pending.pop(0)
            group.epochs.append(entry.epoch, entry.start_offset)
        return pending

    async def _dispatch(self) -> None:
        await asyncio.to_thread(self._group.store.dispatch_copied)
        self._group.appended()  # reads waiting on this replica see the new messages

    async def _dispatched(self) -> None:
        """Wait for the dispatch of the chunk before (the store's lock is the loop's next)."""
        dispatching, self._dispatching = self._dispatching, None
        if dispatching is not None:
            await dispatching

    async def _store_chunk(self, chunk: pb.LogChunk, pending: list[EpochEntry]) -> list[EpochEntry]:
        group = self._group
        end = chunk.offset + len(chunk.data)
        while pending and pending[0].start_offset < end:
            entry = pending.pop(0)
            group.epochs.append(entry.epoch, entry.start_offset)
        group.store.write_replica_copy(chunk.offset, chunk.data)
        group.learn_confirm(chunk.confirm_offset)
        if group.settings.slave_ack_after_fsync:
            await asyncio.to_thread(group.store.commitlog.sync)
        return pending

    async def _write(self, call: Any, message: pb.ReplicaToMaster) -> None:
        async with self._writing:  # acks and a Leave come from different tasks
            await call.write(message)

    async def leave(self) -> bool:
        """Tell the master this replica is stopping (it proposes the SyncStateSet without
        it); False when no stream is open."""
        call = self._call
        if call is None:
            return False
        try:
            await self._write(call, pb.ReplicaToMaster(leave=pb.Leave()))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            return False
        return True

    def _ack(self) -> pb.ReplicaToMaster:
        store = self._group.store
        damaged = self.damaged()
        return pb.ReplicaToMaster(
            ack=pb.ReplicaAck(
                stored_offset=store.max_phys_offset,
                flushed_offset=store.commitlog.flushed_offset,
                metadata_sequence=self._metadata_sequence,
                damaged=bool(damaged),
                damaged_offset=damaged[0] if damaged else 0,
                whole_state_wanted=self._whole_wanted,
            )
        )
