"""This broker's place in its replica group: its role, the slaves following it, and the
acknowledgement of writes.

The broker asks `before_write()` whether a write may be taken at all (a slave refuses; a
master with too few copies in sync answers IN_SYNC_REPLICAS_NOT_ENOUGH before anything is
stored) and, once the write is in its own CommitLog, awaits `after_write(end)` for the
copies (`AckWaiters`). Master streams (`master_stream.py`) report their slaves here; the
slave's follower (`slave_stream.py`) runs when this broker is a slave.

Epochs: a master of epoch E appends `(E, its max offset)` to the epoch file before it takes
its first write. Without a controller the epoch stays 0 and the roles come from the config.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass, field

from capstan.broker.replication.ack_policy import (
    AckOutcome,
    AckSettings,
    in_sync_count,
    need_ack_nums,
)
from capstan.broker.replication.ack_waiters import AckWaiters
from capstan.broker.replication.epoch_file import EpochFile
from capstan.broker.settings import ReplicationSettings
from capstan.broker.store.message_store import MessageStore

log = logging.getLogger(__name__)


class Role(enum.Enum):
    STANDALONE = "standalone"
    MASTER = "master"
    SLAVE = "slave"


@dataclass(slots=True)
class SlaveLink:
    """A slave streaming from this master, as the master sees it."""

    broker_id: int
    address: str
    stored_offset: int = 0
    flushed_offset: int = 0
    connected_at: float = field(default_factory=time.monotonic)
    caught_up_at: float = field(default_factory=time.monotonic)
    """When its acks last reached the master's end."""


def ack_settings(s: ReplicationSettings) -> AckSettings:
    """The acknowledgement rules: the settings' own numbers, or the safe defaults."""
    safe = AckSettings.safe_defaults(s.replicas)
    in_sync = s.in_sync_replicas or safe.in_sync_replicas
    return AckSettings(
        in_sync_replicas=in_sync,
        min_in_sync_replicas=min(s.min_in_sync_replicas or safe.min_in_sync_replicas, in_sync),
        all_ack_in_sync_state_set=s.all_ack_in_sync_state_set and s.replicas > 1,
        enable_auto_in_sync_replicas=s.enable_auto_in_sync_replicas,
        ha_max_gap_not_in_sync_bytes=s.ha_max_gap_not_in_sync_bytes,
    )


class ReplicaGroup:
    """Use from the broker's event loop."""

    def __init__(
        self,
        settings: ReplicationSettings,
        broker_name: str,
        store: MessageStore,
        epochs: EpochFile,
    ) -> None:
        self.settings = settings
        self.broker_name = broker_name
        self.store = store
        self.epochs = epochs
        self.ack = ack_settings(settings)
        self.role = Role(settings.role)
        self.broker_id = settings.broker_id
        self.master_epoch = 0
        self.master_address = settings.master_address
        self.sync_state_set: frozenset[int] | None = None  # known with a controller only
        self.links: dict[int, SlaveLink] = {}
        self.waiters = AckWaiters(self._counted_set)
        self._appended = asyncio.Event()
        self.confirm_offset = store.max_phys_offset

    # -- role ----------------------------------------------------------------------------

    def start(self) -> None:
        entries = self.epochs.load()
        end = self.store.max_phys_offset
        if entries and entries[-1].start_offset > end:
            # A crash between cutting the log and the epoch file (see epoch_file.py).
            self.epochs.truncate_from(end + 1)
        if self.role is Role.MASTER:
            self._claim_epoch(self.master_epoch)

    def _claim_epoch(self, epoch: int) -> None:
        last = self.epochs.last()
        if last is None or last.epoch < epoch:
            self.epochs.append(epoch, self.store.max_phys_offset)
        elif last.epoch > epoch:
            raise RuntimeError(
                f"epoch file already holds epoch {last.epoch}; cannot lead as epoch {epoch}"
            )

    def stop(self) -> None:
        """Shutting down: writes still waiting for copies are not acknowledged."""
        self.waiters.fail_all()

    @property
    def is_master(self) -> bool:
        return self.role is not Role.SLAVE

    # -- the write path ------------------------------------------------------------------

    def before_write(self) -> int | AckOutcome:
        """Copies a new write must reach (the master's included), or why it is refused."""
        if self.role is Role.STANDALONE:
            return 1
        if self.role is Role.SLAVE:
            return AckOutcome.IN_SYNC_REPLICAS_NOT_ENOUGH
        end = self.store.max_phys_offset
        acked = {sid: link.stored_offset for sid, link in self.links.items()}
        counted = self._counted_set()
        if counted is not None:
            acked = {sid: off for sid, off in acked.items() if sid in counted}
        in_sync = in_sync_count(end, acked, self.ack.ha_max_gap_not_in_sync_bytes)
        return need_ack_nums(
            self.ack,
            sync_state_set_size=len(counted) if counted is not None else 1,
            in_sync_count=in_sync,
            alive_replicas=1 + len(self.links),
            slave_acting_master=self.sync_state_set is None,
        )

    async def after_write(self, end: int, need: int) -> AckOutcome:
        self.appended()
        if need <= 1:
            self._advance_confirm()
            return AckOutcome.PUT_OK
        return await self.waiters.wait(end, need, self.settings.slave_ack_timeout_ms / 1000)

    def appended(self) -> None:
        """Bytes were appended without waiting for copies (the broker's own writes)."""
        self._appended.set()
        self._appended = asyncio.Event()

    async def wait_appended(self, offset: int, timeout_s: float) -> None:
        """Until the CommitLog grows past `offset` or `timeout_s` passes."""
        if self.store.max_phys_offset > offset:
            return
        event = self._appended
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            return

    def _counted_set(self) -> frozenset[int] | None:
        """The slaves whose acks settle writes in all-ack mode (the SyncStateSet), or
        None when any slave's ack counts."""
        if self.sync_state_set is None or not self.ack.all_ack_in_sync_state_set:
            return None
        return self.sync_state_set

    # -- slaves --------------------------------------------------------------------------

    def slave_connected(self, broker_id: int, address: str, offset: int) -> SlaveLink:
        link = SlaveLink(broker_id, address, offset, offset)
        self.links[broker_id] = link
        log.info("slave %d (%s) follows from offset %d", broker_id, address, offset)
        return link

    def slave_acked(self, link: SlaveLink, stored: int, flushed: int) -> None:
        link.stored_offset = max(link.stored_offset, stored)
        link.flushed_offset = max(link.flushed_offset, flushed)
        if link.stored_offset >= self.store.max_phys_offset:
            link.caught_up_at = time.monotonic()
        counted = link.flushed_offset if self.settings.slave_ack_after_fsync else link.stored_offset
        self.waiters.record(link.broker_id, counted)
        self._advance_confirm()

    def slave_gone(self, link: SlaveLink) -> None:
        if self.links.get(link.broker_id) is link:
            del self.links[link.broker_id]
            self.waiters.forget(link.broker_id)
            log.warning("slave %d (%s) stopped following", link.broker_id, link.address)

    def _advance_confirm(self) -> None:
        """What consumers may read: with a SyncStateSet, what every member holds."""
        end = self.store.max_phys_offset
        members = self.sync_state_set
        if members is None:
            self.confirm_offset = end
            return
        offsets = [end]
        for member in members:
            if member == self.broker_id:
                continue
            link = self.links.get(member)
            offsets.append(link.stored_offset if link is not None else 0)
        self.confirm_offset = max(self.confirm_offset, min(offsets))

    def lag_bytes(self) -> dict[int, int]:
        end = self.store.max_phys_offset
        return {sid: max(0, end - link.stored_offset) for sid, link in self.links.items()}
