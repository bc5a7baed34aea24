"""A slave mends the records of its CommitLog that fail their checks.

Bytes at rest rot: a flipped bit in a slave's copy of an acknowledged message goes unseen
until something reads it, and a slave promoted with it would have lost that message. The
healer finds such records two ways: a read that meets one (the store's `damage_seen`), and
a scrub that checks every stored record's CRCs in turn, `scrub_bytes_per_s` at most. For
each it asks the master for the record (capstan.v1.Replication/FetchRecord; both logs hold
the same bytes at the same offsets) and writes the master's copy over its own, fsynced.

While a damaged record waits (the master is away, or its copy is damaged too), the slave's
acks say so and the master proposes the SyncStateSet without it: the group does not count
on a copy it could not give back. Only a slave heals: a master has nobody to ask.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import grpc

from capstan.broker.replication.replica_group import ReplicaGroup
from capstan.common.grpc_limits import MESSAGE_SIZE_OPTIONS
from capstan.security.peers import dial_peer, peer_security
from capstan.v1 import replication_pb2 as pb
from capstan.v1 import replication_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SLICE_S = 0.25
"""The scrub reads `scrub_bytes_per_s * SLICE_S` bytes at a time (at least one record)."""
PASS_PAUSE_S = 10.0
"""Rest between one full pass over the CommitLog and the next."""
RETRY_S = 2.0
"""A record the master could not give is asked for again after this long."""
FETCH_TIMEOUT_S = 10.0


class RecordHealer:
    def __init__(
        self,
        group: ReplicaGroup,
        following: Callable[[], bool],
        scrub_bytes_per_s: int,
        on_healed: Callable[[], None] = lambda: None,
        on_scrubbed: Callable[[int], None] = lambda n: None,
    ) -> None:
        """`following`: whether this broker follows its master now (its log agrees with
        the master's below its end)."""
        self._group = group
        self._following = following
        self._rate = scrub_bytes_per_s
        self._on_healed = on_healed
        self._on_scrubbed = on_scrubbed
        self._lock = threading.Lock()
        self._damaged: set[int] = set()
        """Offsets of records found damaged and not mended yet."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.cursor = group.store.min_phys_offset
        """Where the scrub goes on from."""
        self.passes = 0
        """Full scrub passes over the CommitLog since start."""

    @property
    def damaged(self) -> list[int]:
        """Offsets found damaged and not mended yet, lowest first (read with every ack)."""
        if not self._damaged:  # the usual case, without the lock
            return []
        with self._lock:
            return sorted(self._damaged)

    def found(self, phys_offset: int) -> None:
        """A record at `phys_offset` failed its checks (any thread)."""
        with self._lock:
            new = phys_offset not in self._damaged
            self._damaged.add(phys_offset)
        if new:
            log.error("the record at CommitLog offset %d fails its checks", phys_offset)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="record-healer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        rest_until = 0.0
        loop = asyncio.get_running_loop()
        while True:
            if self._following() and not self._group.is_master:
                if self.damaged:
                    await self._heal_all()
                if self._rate > 0 and loop.time() >= rest_until and await self._scrub_slice():
                    rest_until = loop.time() + PASS_PAUSE_S
            self._wake.clear()
            pause = RETRY_S if self.damaged else SLICE_S
            try:
                await asyncio.wait_for(self._wake.wait(), pause)
            except TimeoutError:
                pass

    async def _scrub_slice(self) -> bool:
        """Check the next slice; True when that ended a pass over the whole log."""
        store = self._group.store
        start = max(self.cursor, store.min_phys_offset)
        budget = max(1, int(self._rate * SLICE_S))
        check = await asyncio.to_thread(store.check_records, start, budget)
        for offset in check.damaged:
            self.found(offset)
        self._on_scrubbed(max(0, min(check.next_offset, store.max_phys_offset) - start))
        if check.skipped:
            log.warning(
                "the scrub skips the rest of the segment after the record at %d (its framing "
                "is gone); the next pass checks it once that record is mended",
                check.damaged[-1],
            )
        self.cursor = check.next_offset
        if self.cursor >= store.max_phys_offset:
            self.passes += 1
            self.cursor = store.min_phys_offset
            return True
        return False

    async def _heal_all(self) -> None:
        group = self._group
        address = group.master_address
        if not address:
            return
        async with dial_peer(address, MESSAGE_SIZE_OPTIONS) as channel:
            stub = pb_grpc.ReplicationStub(channel)  # type: ignore[no-untyped-call]
            for offset in self.damaged:
                if not self._following() or group.is_master:
                    return
                await self._heal(stub, address, offset)

    async def _heal(self, stub: pb_grpc.ReplicationStub, address: str, offset: int) -> None:
        store = self._group.store
        if not store.min_phys_offset <= offset < store.max_phys_offset:
            self._forget(offset)  # retention removed it, or the log was cut back past it
            return
        request = pb.FetchRecordRequest(broker_name=self._group.broker_name, offset=offset)
        try:
            reply = await stub.FetchRecord(
                request, timeout=FETCH_TIMEOUT_S, metadata=peer_security().signature()
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:  # below the master's oldest
                log.warning(
                    "the damaged record at %d is gone from master %s too; retention takes "
                    "this copy as well",
                    offset,
                    address,
                )
                self._forget(offset)
                return
            log.warning(
                "the record at %d is still damaged: master %s gave no copy (%s: %s)",
                offset,
                address,
                exc.code().name,
                exc.details(),
            )
            return
        try:
            rewritten = await asyncio.to_thread(store.heal_record, offset, reply.record)
        except (ValueError, OSError) as exc:
            log.error("the master's copy of the record at %d was not written: %s", offset, exc)
            return
        self._forget(offset)
        if rewritten:
            self._on_healed()
            log.warning(
                "mended the record at CommitLog offset %d with master %s's copy", offset, address
            )
        else:
            log.info("the record at %d reads the same as the master's: nothing to mend", offset)

    def _forget(self, offset: int) -> None:
        with self._lock:
            self._damaged.discard(offset)
