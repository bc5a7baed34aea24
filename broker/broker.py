"""The broker's role and lifecycle: it runs the services (built by services.py) and their
background work, and moves them through role changes (lead, follow, act for an absent
master, step aside). What depends on the role is its own: replication and its watchers,
the write path (write_path.py, the one way messages enter the store, which waits on
replication), the leadership gate, the check-back relay, and the gauges of it all.

It is no facade: the protocol edge gets the services themselves from the composition root
(server.py), each handler only those it uses.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from capstan.broker.consumer_groups.membership import inconsistency
from capstan.broker.group_links import GroupLinks
from capstan.broker.long_polling import ANSWER_MARGIN_S
from capstan.broker.metrics import (
    BrokerGauges,
    GroupLag,
    GroupMembersGauge,
    ReplicationGauge,
)
from capstan.broker.replication.acting_master import ActingMaster
from capstan.broker.replication.check_relay import CheckBackRelay
from capstan.broker.replication.controller_link import ControllerLink, broker_identity
from capstan.broker.replication.down_replicas import DownReplicas
from capstan.broker.replication.epoch_file import EpochFile
from capstan.broker.replication.handover import (
    LeadershipGate,
    hand_over,
    leave_sync_state_set,
)
from capstan.broker.replication.record_healer import RecordHealer
from capstan.broker.replication.replica_group import ReplicaGroup, Role
from capstan.broker.replication.slave_stream import ReplicaFollower
from capstan.broker.replication.state_copy import BrokerStateCopy, StatePart
from capstan.broker.services import BrokerServices
from capstan.broker.static_order_checks import StaticOrderChecks
from capstan.broker.static_placement import StaticPlacement
from capstan.broker.store.message import Message, StoredMessage
from capstan.broker.system_topics import (
    system_topic_configs,
)
from capstan.broker.write_path import WritePath
from capstan.common.clock import now_ms
from capstan.common.disk_full import RoutineFailures
from capstan.common.zone import ZoneReader
from capstan.v1 import replication_pb2 as pb_replication

log = logging.getLogger(__name__)

_HOUSEKEEPING_S = 1.0
HAND_BACK_WITHIN_S = 1.0
"""Hand-outs this close before this broker last heard from the old master count as maybe
unanswered."""
HAND_BACK_VISIBLE_MS = 1000
POP_COPY_WAIT_S = 0.5
MASTERLESS_WAIT_S = 2.0
"""How long a call waits on a replica that follows no master for one to be named (an
election takes well under a second); then it is answered as a slave without a master."""
"""The most a receive or an ack waits for the slaves' copy of the pop state: a slave slower
than that costs the answer no more (a failover then may hand the message out again)."""
HAND_OVER_MIN_S = 5.0
"""A switchover the controller asks for waits at least this long for the successor to hold
everything, whatever handover_timeout_ms says (which bounds the handover at a stop)."""


class Broker:
    """Runs a broker's services through its role; lives on one event loop."""

    def __init__(self, services: BrokerServices, address: str = "") -> None:
        """`services` are built by services.py; `address` is the host:port other brokers
        and the controller reach this one at."""
        settings = services.settings
        store = services.store
        self.services = services
        self.settings = settings
        self.address = address or settings.store.store_host
        self.store = store
        self.metrics = services.metrics
        self.stopping = False
        state_dir = settings.data_path / "state"
        parts = self._state_parts()
        self.state_copy = BrokerStateCopy(parts, services.handles)
        self._part_index = {part.field: i for i, part in enumerate(parts)}
        """Each state part's place in the versions the replication streams track."""
        self.replication: ReplicaGroup | None = None
        self.follower: ReplicaFollower | None = None
        self.healer: RecordHealer | None = None
        self.controller_link: ControllerLink | None = None
        self.down_replicas = DownReplicas(
            self._down_addresses, settings.replication.hung_replica_routed_ms / 1000
        )
        self.order_checks: StaticOrderChecks | None = None
        """Frees FIFO groups held at a moved static queue (needs the controller)."""
        self.acting_master: ActingMaster | None = None
        self.check_relay = CheckBackRelay(settings.broker_name, self._other_replicas)
        self.leadership = LeadershipGate()
        """Closed while this master hands its leadership over: calls and writes wait."""
        self._master_services = False
        rs = settings.replication
        if rs.enabled:
            self.replication = ReplicaGroup(
                rs,
                settings.broker_name,
                store,
                EpochFile(state_dir / "epochs"),
                on_slaves_changed=self._beat_soon,
            )
            self.follower = ReplicaFollower(
                self.replication,
                self.address,
                self.state_copy,
                on_stream_end=self._beat_soon,
                keeps_own_state=self._keeps_own_state,
                on_master_silent=self._beat_soon,
                damaged=self._damaged_records,
            )
            follower = self.follower
            self.healer = RecordHealer(
                self.replication,
                lambda: follower.connected,
                rs.scrub_bytes_per_s,
                self.metrics.replica_healed.inc,
                self.metrics.replica_scrubbed.inc,
            )
            store.damage_seen = self.healer.found
        if self.replication is not None and rs.controlled:
            link = ControllerLink(
                self.replication,
                self.address,
                self,
                broker_identity(state_dir),
                ZoneReader(settings.zone, settings.zone_file).current,
            )
            self.controller_link = link
        elif self.replication is not None and rs.peers:
            self.acting_master = ActingMaster(
                rs,
                settings.broker_name,
                rs.role == "master",
                state_dir / "acting_master.json",
                self,
            )
        self.writes = WritePath(
            settings.broker_name,
            store,
            services.appender,
            services.arrivals,
            self.metrics,
            services.catalog,
            self.replication,
            self.acting_master,
            self.leadership,
            services.escape,
        )
        self.group_links = (
            GroupLinks(self.controller_link.master_of, settings.broker_name)
            if self.controller_link is not None
            else None
        )
        """Calls to other broker groups' masters (static topics; needs the controller)."""
        self.placement = StaticPlacement(services.static_topics, self.writes, self.group_links)
        """Where the timer's and the transactions' messages of static topics go."""
        self._tasks: list[asyncio.Task[None]] = []
        self.metrics.watch(self.gauges, self.store.subscription_groups.names)

    def _damaged_records(self) -> list[int]:
        return self.healer.damaged if self.healer is not None else []

    @property
    def is_master(self) -> bool:
        """Whether this broker takes writes and runs the master-only services."""
        return self.replication is None or self.replication.is_master

    async def catalog_on_slaves(self) -> list[int]:
        """After an admin change of topics or groups: send it to the slaves now and wait
        until those whose copies settle writes hold it (at most slave_ack_timeout_ms); the
        ids of those that still do not. Without slaves: nothing to wait for."""
        group = self.replication
        if group is None or not group.is_master:
            return []
        parts = self._part_index
        target = {
            parts["topics_json"]: self.store.topics.data_version,
            parts["groups_json"]: self.store.subscription_groups.data_version,
        }
        group.catalog_changed()
        return await group.wait_catalog(target, group.settings.slave_ack_timeout_ms / 1000)

    async def pop_state_on_slaves(self, time_left_s: float | None) -> None:
        """After a receive, an ack or a changed invisible time, before the client hears of
        it: send the pop state to the slaves now and wait until those whose copies settle
        writes hold it, so a promoted slave neither hands out again what was received nor
        forgets an ack. At most the stall rule's time (`slave_stall_ms`, else
        `slave_ack_timeout_ms`), never past the client's deadline (`time_left_s`, less a
        margin), and not for a slave that missed such a wait until it catches up
        (ReplicaGroup.wait_pop_copy); past it the answer goes as it is (a failover may then
        hand the message out again)."""
        group = self.replication
        if group is None or not group.is_master or not group.links:
            return
        settings = group.settings
        wait_s = min(
            POP_COPY_WAIT_S, (settings.slave_stall_ms or settings.slave_ack_timeout_ms) / 1000
        )
        if time_left_s is not None:
            wait_s = min(wait_s, time_left_s - ANSWER_MARGIN_S)
        if wait_s <= 0:
            return
        target = {self._part_index["pop_state_json"]: self.services.pop_state.version}
        group.catalog_changed()
        await group.wait_pop_copy(target, wait_s)

    @property
    def serves_master_duties(self) -> bool:
        """The master, or a slave acting for an absent one (offsets, locks, pop, timer,
        transaction checks; not writes)."""
        return self.is_master or (self.acting_master is not None and self.acting_master.acting)

    @property
    def forwards(self) -> bool:
        """Whether calls may be passed on to another replica (master_to_forward_to)."""
        return self.controller_link is not None or self.acting_master is not None

    async def start(self) -> None:
        for config in system_topic_configs():
            if self.store.topics.get(config.name) is None:
                self.store.topics.put(config)
        if self.replication is not None:
            self.replication.start()
        self.services.appender.start()
        if self.is_master:
            if self.acting_master is not None and self.acting_master.enabled:
                await self.acting_master.reclaim()  # before serving: take back acted changes
            self._start_master_services()
        elif self.follower is not None and self.replication is not None:
            self.follower.start()  # a slave by config; it returns at once without a master
        self._tasks.append(asyncio.create_task(self._housekeeping_routine(), name="broker-hk"))
        if self.controller_link is not None and self.group_links is not None:
            self.controller_link.start()
            self.down_replicas.start()
            self.order_checks = StaticOrderChecks(
                self.services.order_gate,
                self.group_links,
                self.services.arrivals.notify,
                lambda: self.serves_master_duties,
            )
            self.order_checks.start()
        if self.acting_master is not None:
            self.acting_master.start()
        if self.healer is not None:
            self.healer.start()

    def _start_master_services(self, acting: bool = False) -> None:
        """The timer and the transaction checks. Acting for an absent master, what they
        store goes elsewhere (duty_put), and transaction decisions into their progress
        file rather than this broker's log."""
        put = self.writes.duty_put if acting else self.placement.put
        self.services.timer.start(put)
        self.services.transactions.start(put, self._check_back, op_log=not acting)
        self._master_services = True

    async def _stop_master_services(self) -> None:
        self._master_services = False
        await self.services.timer.stop()
        await self.services.transactions.stop()

    async def calls_may_proceed(self) -> None:
        """Where a call that may be passed on waits first: while this master hands its
        leadership over (the gate), and while this replica, under a controller, follows no
        master because the last one is gone and the next is being elected (at most
        MASTERLESS_WAIT_S): answered by the new master a moment later rather than refused
        ("its master is unknown"), which the official clients do not retry."""
        await self.leadership.passed()
        r = self.replication
        if r is None or self.controller_link is None:
            return
        if r.role is Role.SLAVE and not r.master_address and not self.stopping:
            await r.master_named(MASTERLESS_WAIT_S)

    def master_to_forward_to(self) -> str:
        """The replica this broker passes calls on to (forwarding.py), "" when it serves
        them itself: under a controller, the master while this broker is not it; without
        one, the master while it answers probes, else the slave acting for it."""
        r = self.replication
        if r is None or r.role is Role.MASTER:
            return ""
        if self.controller_link is not None:
            return r.master_address
        if self.acting_master is not None:
            return self.acting_master.duty_address()
        return ""

    def group_addresses(self) -> list[str]:
        """The replicas of this group as routes should list them (a client sticks to one
        that answers), by broker id; empty for a broker alone or one knowing only its
        master. Under a controller, those it counts alive, this broker always, and the
        down ones whose address refuses connections, or has accepted them without serving
        for less than a while (a short stop): a route that leaves a replica out gives the
        official client a channel without it until its next refresh (down_replicas.py)."""
        if self.acting_master is not None:
            peers = dict(self.settings.replication.peer_addresses)
            peers.setdefault(self.settings.replication.broker_id, self.address)
            return [peers[i] for i in sorted(peers)]
        info = self.controller_link.info if self.controller_link is not None else None
        if info is None:
            return []
        replicas = sorted((r for r in info.replicas if r.address), key=lambda r: r.broker_id)
        if not any(r.alive for r in replicas):  # no liveness known (a controller follower)
            return [r.address for r in replicas]
        silent = self.down_replicas.silent
        return [
            r.address
            for r in replicas
            if r.alive or r.address == self.address or r.address not in silent
        ]

    def _down_addresses(self) -> list[str]:
        """The replicas of this group the controller counts down (DownReplicas probes them)."""
        info = self.controller_link.info if self.controller_link is not None else None
        if info is None or not any(r.alive for r in info.replicas):
            return []
        return [r.address for r in info.replicas if r.address and not r.alive]

    def group_writable(self) -> bool:
        """Whether the group takes writes now as far as this broker knows (routes mark its
        queues read-only while a slave acts for an absent master)."""
        if self.acting_master is None or self.is_master:
            return True
        return self.acting_master.master_alive()

    # -- slave-acting-master (acting_master.py calls these) ---------------------------

    async def start_acting(self) -> None:
        self.store.read_limit = None  # serve everything this copy holds
        self._start_master_services(acting=True)

    async def stop_acting(self) -> None:
        await self._stop_master_services()
        if self.replication is not None:
            self.store.read_limit = self.replication.confirm_offset

    def _beat_soon(self) -> None:
        """The SyncStateSet may change, or another master may be named: under a
        controller, ask it now rather than at the next heartbeat."""
        if self.controller_link is not None:
            self.controller_link.beat_soon()

    def _keeps_own_state(self) -> bool:
        """Whether this slave holds what it changed while acting for its master (until the
        master takes it back), so the master's metadata must not overwrite it."""
        return self.acting_master is not None and self.acting_master.holds_acted_state

    def _state_parts(self) -> list[StatePart]:
        """What of this broker's state its slaves copy, part by part (state_copy.py)."""
        store, pop_state, locks = self.store, self.services.pop_state, self.services.queue_locks
        timer, transactions = self.services.timer, self.services.transactions

        def config(table: Any, field: str, what: str) -> StatePart:
            return StatePart(
                field,
                lambda: int(table.data_version),
                table.export,
                lambda document: table.replace_all(document, f"master's {what}"),
                master_only=field != "consumer_offsets_json",
            )

        return [
            config(store.topics, "topics_json", "topics"),
            config(store.subscription_groups, "groups_json", "subscription groups"),
            config(store.consumer_offsets, "consumer_offsets_json", "consumer offsets"),
            config(store.users, "users_json", "users"),
            config(store.queue_mappings, "queue_mappings_json", "queue mappings"),
            StatePart(
                "pop_state_json",
                lambda: pop_state.version,
                pop_state.export,
                pop_state.replace_all,
                on_loop=True,
                changes_since=pop_state.changes_since,
                changes_field="pop_state_lines",
                adopt_changes=pop_state.apply_changes,
            ),
            StatePart(
                "timer_progress_json",
                lambda: timer.recorded,
                lambda: {"offset": timer.recorded},
                timer.adopt_progress,
            ),
            StatePart(
                "transaction_progress_json",
                lambda: transactions.version,
                transactions.progress,
                transactions.adopt_progress,
                on_loop=True,
            ),
            StatePart(
                "queue_locks_json",
                lambda: locks.version,
                locks.export,
                locks.replace_all,
                on_loop=True,
            ),
            StatePart(
                "compacted_json",
                lambda: store.compacted.version,
                store.compacted.generations,
                None,  # the slave fetches an older copy itself (slave_stream.py)
                master_only=True,
            ),
        ]

    def taken_back(self) -> pb_replication.Metadata:
        return self.state_copy.taken_back()

    async def adopt_taken_back(self, state: pb_replication.Metadata) -> None:
        running = self._master_services
        if running:
            await self._stop_master_services()
        await asyncio.to_thread(self.state_copy.apply_files, state)
        self.state_copy.apply_services(state)
        if running:
            self._start_master_services()

    async def copy_afresh(self) -> None:
        if self.follower is not None:
            await self.follower.stop()
            self.follower.start()

    # -- role changes (the controller's, through ControllerLink) ----------------------

    async def lead(
        self, epoch: int, sync_state_set: frozenset[int], sync_state_set_epoch: int
    ) -> None:
        """Become the group's master: stop copying from the old one first, so the epoch
        starts after the last byte this broker will ever take from it."""
        replication = self.replication
        assert replication is not None
        if self.follower is not None:
            await self.follower.stop()
        was_master = replication.role is Role.MASTER
        await asyncio.to_thread(self.store.dispatch_pending)
        replication.lead(epoch, sync_state_set, sync_state_set_epoch)
        if not was_master:
            self._hand_back_recent_receives()
            self._start_master_services()

    def _hand_back_recent_receives(self) -> None:
        """Messages the old master handed out just before this broker last heard from it
        may never have reached their consumer (the receive's answer died with it):
        they come due again `HAND_BACK_VISIBLE_MS` from now, not at their own invisible
        time (the official PushConsumer's 30 s); a consumer that did get one acknowledges
        it here meanwhile, with the handle it holds."""
        heard = self.follower.last_heard if self.follower is not None else None
        if heard is None:
            return
        pop_state = self.services.pop_state
        since = heard - HAND_BACK_WITHIN_S
        count = pop_state.hand_back_recent(since, now_ms() + HAND_BACK_VISIBLE_MS)
        if count:
            pop_state.write()
            log.info("%d message(s) handed out just before the failover come due again", count)

    async def follow(self, master_address: str, epoch: int) -> None:
        """Stop leading (no waiting write is acknowledged) and copy from `master_address`."""
        replication = self.replication
        assert replication is not None
        was_master = replication.role is Role.MASTER
        replication.follow(master_address, epoch)
        if was_master:
            await self._stop_master_services()
        if self.follower is not None:
            await self.follower.stop()
            if master_address:
                self.follower.start()

    async def step_aside(self) -> None:
        """Before a stop under a controller: a master hands its leadership to a caught-up
        SyncStateSet member, a slave leaves the SyncStateSet (handover.py)."""
        link, group, follower = self.controller_link, self.replication, self.follower
        if link is None or group is None or follower is None:
            return
        timeout_s = self.settings.replication.handover_timeout_ms / 1000
        if group.role is Role.MASTER:
            _, outcome = await hand_over(
                group,
                link,
                self.leadership,
                lambda: follower.connected,
                follower.leave,
                timeout_s,
            )
        else:
            outcome = await leave_sync_state_set(group, link, follower.leave, timeout_s)
        log.warning("stopping broker %d of %s: %s", group.broker_id, group.broker_name, outcome)

    async def hand_over_to(self, successor: int) -> tuple[bool, str]:
        """A switchover asked by the controller (capstan.v1.Admin/HandOver): hold writes
        until `successor` holds everything, then make it master; this broker follows it."""
        link, group, follower = self.controller_link, self.replication, self.follower
        if link is None or group is None or follower is None:
            return False, "this broker has no controller"
        timeout_s = max(self.settings.replication.handover_timeout_ms / 1000, HAND_OVER_MIN_S)
        return await hand_over(
            group,
            link,
            self.leadership,
            lambda: follower.connected,
            None,
            timeout_s,
            successor,
        )

    async def stop(self) -> None:
        """Stop background work and write everything down (the store stays open)."""
        self.stopping = True
        self.services.arrivals.notify_all()
        self.services.members.wake_all()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.order_checks is not None:
            await self.order_checks.stop()
        if self.group_links is not None:
            await self.group_links.close()
        await self.down_replicas.stop()
        if self.controller_link is not None:
            await self.controller_link.stop()
        if self.acting_master is not None:
            await self.acting_master.stop()
        if self.follower is not None:
            await self.follower.stop()
        if self.healer is not None:
            await self.healer.stop()
        await self._stop_master_services()
        await self.services.escape.close()
        await self.check_relay.close()
        await self.services.appender.stop()
        self.services.pop.commit_offsets()
        self.services.pop_state.close()

    # -- background --------------------------------------------------------------------

    async def _housekeeping_routine(self) -> None:
        synced_at = 0.0
        loop = asyncio.get_running_loop()
        failures = RoutineFailures(log, "broker housekeeping")
        while True:
            await asyncio.sleep(_HOUSEKEEPING_S)
            try:
                if self.serves_master_duties:
                    freed = await self.services.pop.revive(
                        self.store.subscription_groups.get, self.writes.put_dead_letter
                    )
                    for topic in freed:  # a FIFO queue the dead letters blocked is free
                        self.services.arrivals.notify(topic)
                    self.services.pop.commit_offsets()
                self.services.clients.expire()
                for group, client_id in self.services.members.expire():
                    self.forget_consumer(group, client_id, "its heartbeats stopped")
                if loop.time() - synced_at >= self.settings.pop.journal_sync_interval_ms / 1000:
                    await asyncio.to_thread(self.services.pop_state.sync)
                    synced_at = loop.time()
            except Exception as exc:  # noqa: BLE001 - the routine retries whatever failed
                failures.failed(exc)
            else:
                failures.succeeded()

    def forget_consumer(self, group: str, client_id: str, why: str) -> None:
        """A consumer left `group`: drop it from the members and release its queue locks."""
        self.services.members.remove(group, client_id)
        released = self.services.queue_locks.release_client(group, client_id)
        log.info(
            "consumer %s left group %s (%s); %d queue locks released",
            client_id,
            group,
            why,
            released,
        )

    async def _check_back(self, half: StoredMessage, restored: Message, tx_id: str) -> bool:
        """Ask a producer of the topic connected here, else one connected to another
        replica; failing both, any producer, here first."""
        record = None
        for any_producer in (False, True):
            if self.services.clients.check_back(half, restored.topic, tx_id, any_producer):
                self.metrics.transaction_checks.labels("local").inc()
                return True
            record = record or self.store.stored_record(
                half.topic, half.queue_id, half.queue_offset
            )
            if record is not None and await self.check_relay.ask(
                record, restored.topic, tx_id, any_producer
            ):
                self.metrics.transaction_checks.labels("replica").inc()
                return True
        return False

    def _other_replicas(self) -> list[str]:
        return [a for a in self.group_addresses() if a != self.address]

    def gauges(self) -> BrokerGauges:
        lag: dict[tuple[str, str], int] = {}
        for group in self.store.subscription_groups.names():
            offsets = self.store.consumer_offsets.offsets_of_group(group)
            for (topic, qid), committed in offsets.items():
                bounds = self.store.queue_bounds(topic, qid)
                if bounds is not None:
                    behind = max(0, bounds[1] - max(committed, bounds[0]))
                    lag[group, topic] = lag.get((group, topic), 0) + behind
        inflight: dict[tuple[str, str], int] = {}
        for (group, topic, _), q in self.services.pop_state.queues.items():
            inflight[group, topic] = inflight.get((group, topic), 0) + len(q.inflight)
        clients = self.services.clients.counts()
        return BrokerGauges(
            topics=len(self.store.topics),
            groups=len(self.store.subscription_groups),
            producers=clients.producers,
            consumers=clients.consumers,
            lags=[GroupLag(g, t, n, inflight.get((g, t), 0)) for (g, t), n in lag.items()],
            pending_delayed=self.services.timer.pending,
            pending_half=self.services.transactions.pending,
            group_members=[
                GroupMembersGauge(g, len(ms), bool(inconsistency(ms)))
                for g in self.services.members.group_names()
                for ms in [self.services.members.members(g)]
            ],
            commitlog_max_offset=self.store.commitlog.write_offset,
            dispatch_behind_bytes=self.store.commitlog.write_offset - self.store.dispatched_offset,
            long_polls_suspended=self.services.arrivals.waiting,
            replication=self._replication_gauge(),
            commitlog_bytes=self.store.commitlog.write_offset - self.store.commitlog.min_offset,
            disk_used_ratio=self.store.disk_used_ratio(),
            disk_max_used_ratio=self.store.settings.disk_max_used_ratio,
        )

    def _replication_gauge(self) -> ReplicationGauge | None:
        r = self.replication
        if r is None:
            return None
        return ReplicationGauge(
            is_master=r.is_master,
            master_epoch=r.master_epoch,
            sync_state_set_size=len(r.sync_state_set or ()),
            acks_waiting=r.waiters.waiting,
            confirm_offset=r.confirm_offset,
            slave_lag_bytes=r.lag_bytes(),
            acting_master=self.acting_master is not None and self.acting_master.acting,
            min_in_sync_replicas=r.ack.min_in_sync_replicas,
            damaged_records=len(self._damaged_records()),
        )
