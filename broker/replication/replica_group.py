"""This broker's place in its replica group: its role, the slaves following it, and the
acknowledgement of writes.

The broker asks `before_write()` whether a write may be taken at all (a slave refuses; a
master with too few copies in sync answers IN_SYNC_REPLICAS_NOT_ENOUGH before anything is
stored) and, once the write is in its own CommitLog, awaits `after_write(end)` for the
copies (`AckWaiters`). Master streams (`master_stream.py`) report their slaves here; the
slave's follower (`slave_stream.py`) runs when this broker is a slave.

Epochs: a master of epoch E appends `(E, its max offset)` to the epoch file before it takes
its first write. Without a controller the epoch stays 0 and the roles come from the config;
with one, `lead()` and `follow()` switch the role as the controller says (the broker's
`ControllerLink` calls them), and the SyncStateSet is the controller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field

from capstan.broker.replication.ack_policy import (
    AckOutcome,
    AckSettings,
    in_sync_count,
    need_ack_nums,
    quorum_offset,
)
from capstan.broker.replication.ack_waiters import AckWaiters
from capstan.broker.replication.epoch_file import EpochFile
from capstan.broker.replication.sync_state_set import (
    SlaveProgress,
    confirm_offset,
    propose_sync_state_set,
)
from capstan.broker.store.message_store import MessageStore
from capstan.common.aio_wait import wait_event
from capstan.common.broker_settings import ReplicationSettings

log = logging.getLogger(__name__)

_REJOIN_POLL_S = 0.01
_SHRINK_ANSWER_S = 0.5
"""What a SyncStateSet shrink asked of the controller is given to be recorded, in seconds."""
CATALOG_RECHECK_S = 0.05
"""How often a wait for the slaves' copy of state looks again at who it waits for."""


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
    progress_at: float = field(default_factory=time.monotonic)
    """When its acknowledged offset last moved forward (or it connected)."""
    mark: tuple[int, float] | None = None
    """(the master's max offset, when) at a chunk sent since the slave last caught up."""
    catalog_sent: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Metadata sequence -> the versions of the state parts as it was sent (state_copy.py),
    until acknowledged."""
    catalog_applied: tuple[int, ...] = ()
    """The version of each state part the slave holds as of this stream's metadata."""
    whole_wanted: bool = False
    """The slave asked for the parts that travel as changes whole (it skipped some)."""
    whole_sent: int = 0
    """The sequence of the last Metadata that carried every part whole."""

    def applied(self, part: int) -> int:
        return self.catalog_applied[part] if part < len(self.catalog_applied) else -1


def ack_settings(s: ReplicationSettings) -> AckSettings:
    """The acknowledgement rules: the settings' own numbers, or the safe defaults. Under a
    controller 3 or more replicas acknowledge by quorum unless told otherwise, a write
    needing `min_in_sync_replicas` copies (a majority by default); fewer, every member."""
    safe = AckSettings.safe_defaults(s.replicas)
    all_ack = s.all_ack_in_sync_state_set
    if all_ack is None:
        all_ack = s.replicas < 3 or not s.controlled
    minimum = s.min_in_sync_replicas or safe.min_in_sync_replicas
    by_quorum = s.controlled and s.replicas > 1 and not all_ack
    in_sync = s.in_sync_replicas or (minimum if by_quorum else safe.in_sync_replicas)
    return AckSettings(
        in_sync_replicas=in_sync,
        min_in_sync_replicas=min(minimum, in_sync),
        all_ack_in_sync_state_set=all_ack and s.replicas > 1,
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
        on_slaves_changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.broker_name = broker_name
        self.store = store
        self.epochs = epochs
        self.ack = ack_settings(settings)
        # Under a controller a broker takes no writes until the controller names it master.
        self.role = Role.SLAVE if settings.controlled else Role(settings.role)
        self.broker_id = settings.broker_id
        self.master_epoch = 0
        self.master_address = settings.master_address
        self.sync_state_set: frozenset[int] | None = None  # known with a controller only
        self.sync_state_set_epoch = 0
        self.joining: set[int] = set()
        """Slaves proposed for the SyncStateSet: until the controller answers, their acks
        are awaited as if they were members, so nothing is acknowledged without them that
        they would have to hold once they are (RocketMQ's remote SyncStateSet)."""
        self.leaving: set[int] = set()
        """Slaves that said they are stopping: proposed out of the SyncStateSet at once and
        not proposed back until they follow again."""
        self.damaged: set[int] = set()
        """Slaves whose acks say they hold a record that fails its checks: proposed out of
        the SyncStateSet, and not back until an ack says it is mended (record_healer.py)."""
        self.links: dict[int, SlaveLink] = {}
        self.lost: dict[int, tuple[float, int]] = {}
        """Per slave whose stream ended: (when, the offset it had acknowledged)."""
        self.stalled_out: set[int] = set()
        """Members proposed out of the SyncStateSet because they stalled
        (`stalled_members`): once the controller agrees, the writes waiting for them settle
        for the smaller set."""
        self._stall_check: asyncio.TimerHandle | None = None
        self._write_waited_at = float("-inf")
        """When a write last found the set unable to take it (before_write_settled)."""
        self.caught_up_at: dict[int, float] = {}
        """Per slave id, when its acks last reached what the master held (monotonic);
        kept across reconnects, so a short break does not cost its SyncStateSet seat."""
        self.ack_quorum = (
            self.ack.in_sync_replicas
            if settings.controlled and not self.ack.all_ack_in_sync_state_set
            else 0
        )
        """Under a controller with all_ack_in_sync_state_set off: the copies a write needs
        among the SyncStateSet, the master's included (RocketMQ's inSyncReplicas as each
        write's needAckNums), whichever members they are; 0: every member's."""
        self.waiters = AckWaiters(self._counted_set, quorum=self.ack_quorum > 0)
        self.on_slaves_changed = on_slaves_changed
        """Called when a slave leaves, its stream ends, or a slave outside the SyncStateSet
        catches up: the controller link proposes the new SyncStateSet at once rather than
        at its next heartbeat."""
        self.led_at = float("-inf")
        """When this broker last took the lead (monotonic)."""
        self._appended = asyncio.Event()
        self.stopping = False
        """Set by stop(): the broker is shutting down."""
        self.master_lost_epoch = 0
        """As a slave: the master epoch whose master's stream broke (refused or reset) and
        has not been followed since; the controller hears of it with the next heartbeat.
        0: none."""
        self._catalog_applied = asyncio.Event()
        self._master_named = asyncio.Event()
        """Set while a master is known: this broker leads, or follows a named one."""
        self._leadership_moved = asyncio.Event()
        """Set (and replaced) at each role change: calls passed on to the master wake."""
        if self.role is Role.MASTER or self.master_address:
            self._master_named.set()
        self.catalog_nudges = 0
        self._copy_behind: set[int] = set()
        """Slaves that did not confirm a pop-state copy in time (wait_pop_copy)."""
        self._confirm_offset = 0
        self.confirm_offset = store.max_phys_offset

    @property
    def confirm_offset(self) -> int:
        """What consumers may read up to: every SyncStateSet member holds the bytes below.
        A restarted broker starts from its whole log and a slave then learns the master's."""
        return self._confirm_offset

    @confirm_offset.setter
    def confirm_offset(self, value: int) -> None:
        moved = value > self._confirm_offset
        self._confirm_offset = value
        self.store.read_limit = value
        if moved:
            self.appended()  # master streams pass the news on to their slaves

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
        """Shutting down: writes still waiting for copies are not acknowledged, later ones
        wait for none, and the slaves' streams end now rather than at the server's grace."""
        self.stopping = True
        self.waiters.fail_all()
        self.appended()

    def lead(self, epoch: int, sync_state_set: frozenset[int], sync_state_set_epoch: int) -> None:
        """Become the master of `epoch` (the controller elected this broker): record where
        the epoch starts, then take writes."""
        self._claim_epoch(epoch)
        self.role = Role.MASTER
        self.master_epoch = epoch
        self.master_address = ""
        now = self.led_at = time.monotonic()
        self.caught_up_at = dict.fromkeys(sync_state_set, now)
        self.set_sync_state_set(sync_state_set, sync_state_set_epoch)
        self._advance_confirm()
        self._master_named.set()
        self._tell_leadership_moved()
        log.warning(
            "broker %d now leads %s at master epoch %d from offset %d",
            self.broker_id,
            self.broker_name,
            epoch,
            self.store.max_phys_offset,
        )

    def follow(self, master_address: str, epoch: int) -> None:
        """Stop leading (if this broker did) and follow `master_address` ("" when the group
        has no master): writes waiting for copies fail, new ones are refused."""
        if self.role is Role.MASTER:
            failed = self.waiters.fail_all()
            log.warning(
                "broker %d of %s deposed at master epoch %d; %d waiting write(s) not acknowledged",
                self.broker_id,
                self.broker_name,
                epoch,
                failed,
            )
        self.role = Role.SLAVE
        self.joining.clear()
        if master_address != self.master_address or epoch != self.master_epoch:
            self.master_lost_epoch = 0  # another master, or the same one at a new epoch
        self.master_epoch = max(self.master_epoch, epoch)
        self.master_address = master_address
        if master_address:
            self._master_named.set()
        else:
            self._master_named.clear()
        self._tell_leadership_moved()
        self.appended()  # the streams to this broker's slaves end now, not at their next beat

    def _tell_leadership_moved(self) -> None:
        moved, self._leadership_moved = self._leadership_moved, asyncio.Event()
        moved.set()

    async def leadership_moved(self) -> None:
        """Return at this broker's next role change (it leads, or follows a master again or
        another one): what a call passed on to the master waits on besides its answer."""
        await self._leadership_moved.wait()

    async def master_named(self, timeout_s: float) -> None:
        """Return once a master is known (this broker leads or follows one), or after
        `timeout_s`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._master_named.wait(), timeout_s)

    def set_sync_state_set(self, members: frozenset[int], epoch: int) -> None:
        """The controller's SyncStateSet for this master; acks and the confirm offset are
        weighed against it from now on."""
        if self.sync_state_set == members and self.sync_state_set_epoch == epoch:
            return
        if self.sync_state_set is not None and epoch < self.sync_state_set_epoch:
            return  # an older answer overtaken by a newer one
        removed = (self.sync_state_set or frozenset()) - members
        self.sync_state_set = members
        self.sync_state_set_epoch = epoch
        self.joining -= members
        if removed and removed <= self.stalled_out and not self.ack_quorum:
            self.waiters.lower_need(len(self._counted_set() or members))
        self.stalled_out &= members
        self.waiters.recheck()
        self._advance_confirm()

    def sync_state_set_proposal(self) -> frozenset[int] | None:
        """The SyncStateSet to ask the controller for, or None while the current one stands.

        A member that has not caught up for `ha_max_time_slave_not_catchup_ms` (or left
        and has not caught up since) is proposed away. A slave that caught up lately is first
        counted for acks (`joining`); once its acks hold the confirm offset it is proposed.
        """
        members = self.sync_state_set
        if self.role is not Role.MASTER or members is None:
            return None
        now = time.monotonic()
        max_lag_s = self.settings.ha_max_time_slave_not_catchup_ms / 1000
        stepping_out = self.leaving | self.damaged
        stalled = self.stalled_slaves(now)
        if len(members - stalled) < self.ack.min_in_sync_replicas:
            stalled &= self.links.keys() - members  # too few would stay: the 15-s rule alone
        slaves = {
            sid: SlaveProgress(
                link.stored_offset if (link := self.links.get(sid)) is not None else 0,
                float("-inf") if sid in stalled else self.caught_up_at.get(sid, float("-inf")),
                self.master_epoch,
            )
            for sid in (members | self.links.keys()) - {self.broker_id} - stepping_out
        }
        if stalled & self.joining:  # not in the controller's set: let go of it here
            self.joining -= stalled
            if not self.ack_quorum:
                self.waiters.lower_need(len(self._counted_set() or members))
        for sid in self.links.keys() - members - stepping_out - stalled:
            if slaves[sid].last_caught_up_s >= now - max_lag_s and sid not in self.joining:
                self.joining.add(sid)
                log.info("slave %d caught up; counting its acks before it joins", sid)
        proposed = propose_sync_state_set(
            members,
            self.broker_id,
            {sid: p for sid, p in slaves.items() if sid in members or sid in self.joining},
            self.confirm_offset,
            now,
            max_lag_s,
            self.master_epoch,
        )
        if proposed is not None and self.ack_quorum and not members <= proposed:
            # By quorum a member may be the only other copy of what was acknowledged:
            # it leaves only while the quorum of those that stay holds all of that.
            acked = self._stored_offsets()
            if self._quorum_held(proposed, acked) < self.confirm_offset:
                return None
        if proposed is not None and stalled & (members - proposed):
            self.stalled_out |= stalled & (members - proposed)
            log.warning(
                "slave(s) %s acknowledged nothing for %d ms; proposing the SyncStateSet %s",
                sorted(stalled & (members - proposed)),
                self.settings.slave_stall_ms,
                sorted(proposed),
            )
        return proposed

    def stalled_slaves(self, now: float) -> set[int]:
        """Slaves (SyncStateSet members or following) that have acknowledged nothing for
        `slave_stall_ms` while the master holds bytes sent to them: a stopped or hung slave,
        or a member whose stream ended, as opposed to a slow one, which keeps acknowledging.
        A stalled slave is proposed out of the set and does not join it."""
        stall_s = self.settings.slave_stall_ms / 1000
        members = self.sync_state_set
        if not stall_s or members is None or self.role is not Role.MASTER:
            return set()
        found = set()
        end = self.store.max_phys_offset
        for sid in (members | self.links.keys()) - {self.broker_id}:
            link = self.links.get(sid)
            if link is not None:
                waiting_since = link.mark[1] if link.mark is not None else now
                if now - max(waiting_since, link.progress_at) > stall_s:
                    found.add(sid)
            elif sid in self.lost:
                lost_at, acked = self.lost[sid]
                wanted = acked < end or self._write_waited_at > lost_at  # not an idle group's
                if wanted and now - lost_at > stall_s:
                    found.add(sid)
        return found

    def held_by_stall(self, now: float) -> frozenset[int]:
        """Stalled SyncStateSet members that min_in_sync_replicas keeps in the set: no write
        can get their copies, so writes are refused at once (naming them) until they answer
        again or leave the set, rather than wait slave_ack_timeout_ms each."""
        members = self.sync_state_set
        if members is None:
            return frozenset()
        stalled = self.stalled_slaves(now) & members
        if not stalled or len(members - stalled) >= self.ack.min_in_sync_replicas:
            return frozenset()
        return frozenset(stalled)

    def stall_detail(self, held: frozenset[int]) -> str:
        """Which members hold writes back, for the producer's answer."""
        if not held:
            return (
                f"a slave of {self.broker_name} acknowledged nothing for "
                f"{self.settings.slave_stall_ms} ms (it has answered since)"
            )
        named = ", ".join(
            f"{sid} ({link.address})" if (link := self.links.get(sid)) else f"{sid} (gone)"
            for sid in sorted(held)
        )
        return (
            f"slave(s) {named} of {self.broker_name} acknowledged nothing for "
            f"{self.settings.slave_stall_ms} ms, and min_in_sync_replicas="
            f"{self.ack.min_in_sync_replicas} keeps them in the SyncStateSet"
        )

    def refusal_detail(self) -> str:
        """Why `before_write` refuses, for the producer's answer."""
        held = self.held_by_stall(time.monotonic())
        if held:
            return self.stall_detail(held)
        connected = sorted(self.links)
        members = self.sync_state_set
        if members is None:
            return (
                f"slave(s) {connected} connected; a write needs "
                f"{self.ack.min_in_sync_replicas} broker(s) in sync"
            )
        return (
            f"the SyncStateSet of {self.broker_name} is {sorted(members)} and only "
            f"{[self.broker_id, *connected]} answer; a write needs "
            f"{self.ack.min_in_sync_replicas} broker(s) in sync, and every member "
            "that is to hold it"
        )

    def _watch_stalls(self) -> None:
        """While writes wait for copies, look for a stalled member once `slave_stall_ms`
        has passed, and have the SyncStateSet proposed without it at once (not at the next
        heartbeat)."""
        if self._stall_check is not None or not self.settings.slave_stall_ms:
            return
        stall_s = self.settings.slave_stall_ms / 1000
        now = time.monotonic()
        # The first moment a slave that has been sent bytes could count as stalled.
        due = [max(link.mark[1], link.progress_at) for link in self.links.values() if link.mark]
        due += [at for at, _ in self.lost.values() if at + stall_s > now]
        delay_s = max(0.02, min(due, default=now) + stall_s - now) + 0.02
        self._stall_check = asyncio.get_running_loop().call_later(delay_s, self._look_for_stalls)

    def _look_for_stalls(self) -> None:
        self._stall_check = None
        if self.role is not Role.MASTER or self.stopping:
            return
        counted = self._counted_set() or self.sync_state_set or frozenset()
        now = time.monotonic()
        stalled = (self.stalled_slaves(now) & counted) - self.stalled_out
        if stalled:
            self.on_slaves_changed()
        held = self.held_by_stall(now)
        if held:
            failed = self.waiters.fail_needing_more_than(
                len(counted - held), AckOutcome.IN_SYNC_REPLICAS_NOT_ENOUGH
            )
            if failed:
                log.warning("%d write(s) failed: %s", failed, self.stall_detail(held))
        if self.waiters.waiting:
            self._watch_stalls()

    def proposal_refused(self) -> None:
        """The controller kept the set: the slaves proposed to join count no more."""
        self.joining.clear()
        self.waiters.recheck()

    @property
    def is_master(self) -> bool:
        return self.role is not Role.SLAVE

    # -- the write path ------------------------------------------------------------------

    def before_write(self) -> int | AckOutcome:
        """Copies a new write must reach (the master's included), or why it is refused."""
        if self.role is Role.STANDALONE:
            return 1
        if self.role is Role.SLAVE or self.held_by_stall(time.monotonic()):
            return AckOutcome.IN_SYNC_REPLICAS_NOT_ENOUGH
        end = self.store.max_phys_offset
        acked = self._stored_offsets()
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

    def _shrink_due(self) -> float:
        """When the SyncStateSet should have shrunk past members whose streams ended (the
        stall rule's `slave_stall_ms`, then the controller's answer), where
        min_in_sync_replicas lets them go; -inf when no such member is in the set."""
        members = self.sync_state_set or frozenset()
        gone = {sid: at for sid, (at, _) in self.lost.items() if sid in members}
        stall_s = self.settings.slave_stall_ms / 1000
        if not gone or not stall_s or len(members - gone.keys()) < self.ack.min_in_sync_replicas:
            return float("-inf")
        now = time.monotonic()
        if (self.stalled_slaves(now) & gone.keys()) - self.stalled_out:
            self.on_slaves_changed()  # stalled already (an idle group's): propose it now
        return max(max(gone.values()) + stall_s, now) + _SHRINK_ANSWER_S

    async def before_write_settled(self) -> int | AckOutcome:
        """`before_write()`, except that a write the set cannot take yet waits, rather than
        fail, for what is about to change it: a master that took the lead less than
        `slave_ack_timeout_ms` ago waits for its slaves to follow it and count (just after
        an election or a handover they are still reconnecting, and a writer would wait as
        long for acks); a master whose member's stream just ended waits for the set to
        shrink without it (`_shrink_due`)."""
        need = self.before_write()
        if not isinstance(need, AckOutcome):
            return need
        self._write_waited_at = time.monotonic()
        wait_until = max(
            self.led_at + self.settings.slave_ack_timeout_ms / 1000, self._shrink_due()
        )
        while isinstance(need, AckOutcome) and self.role is Role.MASTER:
            if time.monotonic() >= wait_until:
                break
            await asyncio.sleep(_REJOIN_POLL_S)
            need = self.before_write()
        return need

    async def after_write(self, end: int, need: int) -> AckOutcome:
        self.appended()
        counted = self._counted_set()
        if need <= 1 and (counted is None or len(counted) <= 1):
            self._advance_confirm()
            return AckOutcome.PUT_OK
        # The set may have grown since `need` was worked out (a slave joining): the write
        # waits for the set as it is now.
        if self.stopping:  # its slaves' streams are ending: no copy will be confirmed
            return AckOutcome.FLUSH_SLAVE_TIMEOUT
        self._watch_stalls()
        return await self.waiters.wait(end, need, self.settings.slave_ack_timeout_ms / 1000)

    def appended(self) -> None:
        """The log grew or the confirm offset moved: wake whoever waits on either."""
        self._appended.set()
        self._appended = asyncio.Event()

    # -- topics and groups reaching the slaves --------------------------------------------

    def catalog_changed(self) -> None:
        """A change of state the slaves should hold now (topics, groups, pop state): the
        streams send metadata now rather than at their next interval."""
        self.catalog_nudges += 1
        self.appended()

    def metadata_applied(self, link: SlaveLink, sequence: int) -> None:
        """The slave applied the Metadata message `sequence` (and every one before it).
        Every ack repeats the last sequence applied: only one that applies something new
        wakes anyone (else each beat's ack would wake the stream for another beat)."""
        applied = sorted(s for s in link.catalog_sent if s <= sequence)
        if not applied:
            return
        for seq in applied:
            versions = link.catalog_sent.pop(seq)
            link.catalog_applied = tuple(
                max(version, link.applied(part)) for part, version in enumerate(versions)
            )
        self._catalog_applied.set()
        self._catalog_applied = asyncio.Event()
        if self.catalog_nudges:
            self.appended()  # a stream holding back a nudged copy sends it now

    def catalog_lagging(self, target: Mapping[int, int], skip: Container[int] = ()) -> list[int]:
        """The slaves whose copy must hold the state parts as of `target` (part index ->
        version; the slaves whose acks settle writes, but those in `skip`) and do not yet."""
        counted = self._counted_set()
        return sorted(
            sid
            for sid, link in self.links.items()
            if (counted is None or sid in counted)
            and sid not in self.leaving
            and sid not in skip
            and any(link.applied(part) < version for part, version in target.items())
        )

    async def wait_pop_copy(self, target: Mapping[int, int], timeout_s: float) -> None:
        """`wait_catalog` for a receive or an ack: a slave that did not confirm one within
        `timeout_s` is not waited for again until its copy has caught up, so a stopped
        slave costs one wait, not one per call, and the stall rule or the controller takes
        it out of the SyncStateSet meanwhile."""
        lagging = await self.wait_catalog(target, timeout_s, skip=self._copy_behind)
        self._copy_behind = {
            sid
            for sid in self._copy_behind.union(lagging)
            if sid in self.links
            and any(self.links[sid].applied(part) < version for part, version in target.items())
        }

    async def wait_catalog(
        self, target: Mapping[int, int], timeout_s: float, skip: Container[int] = ()
    ) -> list[int]:
        """Until the slaves that count (but those in `skip`) hold the state parts as of
        `target`; the ids of those that still do not when `timeout_s` passes (empty: all
        do)."""
        deadline = time.monotonic() + timeout_s
        while self.role is Role.MASTER:
            lagging = self.catalog_lagging(target, skip)
            left = deadline - time.monotonic()
            if not lagging or left <= 0:
                return lagging
            # Looked at again now and then: a slave that leaves the SyncStateSet (a stall,
            # a lost stream) is waited for no longer.
            await wait_event(self._catalog_applied, min(left, CATALOG_RECHECK_S))
        return []

    async def wait_appended(self, offset: int, timeout_s: float) -> None:
        """Until the CommitLog grows past `offset`, the confirm offset moves, or
        `timeout_s` passes."""
        if self.store.max_phys_offset > offset:
            return
        await wait_event(self._appended, timeout_s)

    def _counted_set(self) -> frozenset[int] | None:
        """The slaves whose acks settle writes: in all-ack mode the SyncStateSet and those
        proposed to join it, by quorum the members alone (only they are weighed when a
        master is elected); None when any slave's ack counts (no controller)."""
        if self.sync_state_set is None:
            return None
        if self.ack_quorum:
            return self.sync_state_set
        if not self.ack.all_ack_in_sync_state_set:
            return None
        return self.sync_state_set | self.joining

    # -- slaves --------------------------------------------------------------------------

    def slave_connected(self, broker_id: int, address: str, offset: int) -> SlaveLink:
        link = SlaveLink(broker_id, address, offset, offset)
        self.links[broker_id] = link
        self.lost.pop(broker_id, None)
        self.leaving.discard(broker_id)
        log.info("slave %d (%s) follows from offset %d", broker_id, address, offset)
        return link

    def chunk_sent(self, link: SlaveLink) -> None:
        """A chunk left for `link`: once the slave acks what the master held now, it had
        caught up as of now (RocketMQ's lastMasterMaxOffset / lastTransferTime)."""
        if link.mark is None:
            link.mark = (self.store.max_phys_offset, time.monotonic())

    def slave_acked(self, link: SlaveLink, stored: int, flushed: int) -> None:
        if stored > link.stored_offset:
            link.progress_at = time.monotonic()
        link.stored_offset = max(link.stored_offset, stored)
        link.flushed_offset = max(link.flushed_offset, flushed)
        if link.stored_offset >= self.store.max_phys_offset:
            link.mark = None
            self.caught_up_at[link.broker_id] = time.monotonic()
            if link.broker_id not in (self.sync_state_set or frozenset()) | self.joining:
                self.on_slaves_changed()  # it may join now
        elif link.mark is not None and link.stored_offset >= link.mark[0]:
            self.caught_up_at[link.broker_id] = link.mark[1]
            link.mark = None
        counted = link.flushed_offset if self.settings.slave_ack_after_fsync else link.stored_offset
        self.waiters.record(link.broker_id, counted)
        self._advance_confirm()

    def slave_leaving(self, link: SlaveLink) -> None:
        """The slave is stopping: propose the SyncStateSet without it now. Its acks still
        count until the controller accepts, as writes were promised its copy."""
        if self.links.get(link.broker_id) is link:
            self.leaving.add(link.broker_id)
            self.joining.discard(link.broker_id)
            log.info("slave %d (%s) is stopping", link.broker_id, link.address)
            self.on_slaves_changed()

    def slave_damage(self, link: SlaveLink, damaged: bool, offset: int) -> None:
        """What the slave's latest ack says of damaged records in its copy."""
        sid = link.broker_id
        if self.links.get(sid) is not link or damaged == (sid in self.damaged):
            return
        if damaged:
            self.damaged.add(sid)
            self.joining.discard(sid)
            log.warning(
                "slave %d (%s) holds a damaged record at %d; proposing the SyncStateSet "
                "without it until it is mended",
                sid,
                link.address,
                offset,
            )
        else:
            self.damaged.discard(sid)
            log.info("slave %d (%s) mended its damaged records", sid, link.address)
        self.on_slaves_changed()

    def slave_gone(self, link: SlaveLink) -> None:
        if self.links.get(link.broker_id) is link:
            del self.links[link.broker_id]
            self.lost[link.broker_id] = (time.monotonic(), link.stored_offset)
            self.joining.discard(link.broker_id)
            self.waiters.forget(link.broker_id)
            log.warning("slave %d (%s) stopped following", link.broker_id, link.address)
            self.on_slaves_changed()
            self._watch_stalls()  # it stalls once slave_stall_ms passes without it back

    def _advance_confirm(self) -> None:
        """What consumers may read: with a SyncStateSet, what every member (and every slave
        proposed to join) holds."""
        end = self.store.max_phys_offset
        if self.sync_state_set is None:
            self.confirm_offset = end
            return
        acked = self._stored_offsets()
        if self.ack_quorum:
            held = self._quorum_held(self.sync_state_set, acked)
            self.confirm_offset = max(self.confirm_offset, held)
            return
        members = self.sync_state_set | self.joining
        self.confirm_offset = max(
            self.confirm_offset, confirm_offset(end, members, self.broker_id, acked)
        )

    def _stored_offsets(self) -> dict[int, int]:
        """What each connected slave has acknowledged holding, by broker id."""
        return {sid: link.stored_offset for sid, link in self.links.items()}

    def _quorum_held(self, members: frozenset[int], acked: dict[int, int]) -> int:
        """What `ack_quorum` copies among `members` hold (ack_policy.quorum_offset)."""
        slaves = [acked.get(m, 0) for m in members if m != self.broker_id]
        return quorum_offset(self.store.max_phys_offset, slaves, self.ack_quorum)

    def learn_confirm(self, master_confirm: int) -> None:
        """A slave heard the master's confirm offset: read up to it, as far as held here."""
        self.confirm_offset = max(
            self.confirm_offset, min(master_confirm, self.store.max_phys_offset)
        )

    def lag_bytes(self) -> dict[int, int]:
        end = self.store.max_phys_offset
        return {sid: max(0, end - link.stored_offset) for sid, link in self.links.items()}
