"""The controller's replica bookkeeping (RocketMQ's ReplicasInfoManager): registration,
heartbeats, elections and SyncStateSet changes, applied to the state store.

Every change is read → decide (a pure function of election.py / sync_state.py) → write
with compare-and-swap; a conflicting write (another controller replica, or a concurrent
call here) is decided again from the fresh state. The stored document:

    {"groups":  {<group>: ReplicaInfo.to_json()},
     "brokers": {<group>: {<identity>: {"id": <broker id>, "address": <host:port>}}}}

One instance is used from one thread at a time (the service serializes calls).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from capstan.common.errors import CapstanError
from capstan.controller.broker_liveness import BrokerLiveness
from capstan.controller.election import Election, elect_master
from capstan.controller.replica_info import ReplicaInfo
from capstan.controller.state_store import StateStore, change_state
from capstan.controller.sync_state import AlterResult, apply_alter_sync_state_set

log = logging.getLogger(__name__)

T = TypeVar("T")


class UnknownGroup(CapstanError):
    """No broker of this group ever registered."""


class UnknownBroker(CapstanError):
    """The broker id is not registered in the group (it must register first)."""


@dataclass(frozen=True)
class ReplicaStatus:
    broker_id: int
    address: str
    alive: bool
    epoch: int
    max_offset: int
    seconds_since_heartbeat: float
    pid: int = 0
    zone: str = ""


@dataclass(frozen=True)
class GroupView:
    """A group's replica info with what the controller knows of each replica now."""

    info: ReplicaInfo
    replicas: tuple[ReplicaStatus, ...]

    @property
    def master_address(self) -> str:
        for r in self.replicas:
            if r.broker_id == self.info.master_id:
                return r.address
        return ""


class ReplicaManager:
    def __init__(self, store: StateStore, liveness: BrokerLiveness, unclean: bool) -> None:
        self._store = store
        self.liveness = liveness
        self.unclean = unclean
        self.ack_quorums: dict[str, int] = {}
        """Per group, the copies its writes need when it acknowledges by quorum (0: all
        SyncStateSet members), as its brokers last said; in memory, like the heartbeats."""
        self.on_election: Callable[[str], None] = lambda group: None
        """Called with the group whenever an election changes its master epoch (a dead
        master replaced, a switchover, a first master, a restarted master overtaken)."""

    # -- reading -------------------------------------------------------------------------

    def group_names(self) -> list[str]:
        return sorted(self._store.read().document.get("groups", {}))

    def view(self, group: str) -> GroupView:
        document = self._store.read().document
        return self._view(document, group)

    def _view(self, document: dict[str, Any], group: str) -> GroupView:
        raw = document.get("groups", {}).get(group)
        if raw is None:
            raise UnknownGroup(f"no broker of group {group!r} has registered")
        info = ReplicaInfo.from_json(raw)
        addresses = {
            entry["id"]: entry["address"] for entry in document["brokers"].get(group, {}).values()
        }
        replicas = []
        for broker_id in sorted(info.replicas):
            beat = self.liveness.last(group, broker_id)
            replicas.append(
                ReplicaStatus(
                    broker_id,
                    beat.address if beat is not None else addresses.get(broker_id, ""),
                    self.liveness.alive(group, broker_id),
                    beat.epoch if beat is not None else 0,
                    beat.max_offset if beat is not None else 0,
                    self.liveness.seconds_since(group, broker_id),
                    beat.pid if beat is not None else 0,
                    beat.zone if beat is not None else "",
                )
            )
        return GroupView(info, tuple(replicas))

    # -- changing ------------------------------------------------------------------------

    def _change(self, decide: Callable[[dict[str, Any]], T]) -> T:
        """Apply `decide` to the state document with compare-and-swap (change_state), with
        the groups' and brokers' tables there to edit."""

        def with_tables(document: dict[str, Any]) -> T:
            document.setdefault("groups", {})
            document.setdefault("brokers", {})
            return decide(document)

        return change_state(self._store, with_tables)

    def register(
        self,
        group: str,
        identity: str,
        address: str,
        epoch: int,
        max_offset: int,
        pid: int = 0,
        leading: bool = True,
        zone: str = "",
    ) -> tuple[int, GroupView]:
        """The broker's id in its group (a new one for a new identity), and the group.
        `leading`: whether the broker says it serves as master now (see `heartbeat`)."""

        def decide(document: dict[str, Any]) -> int:
            brokers = document["brokers"].setdefault(group, {})
            entry = brokers.get(identity)
            if entry is None:
                entry = {"id": 1 + max((e["id"] for e in brokers.values()), default=0)}
                brokers[identity] = entry
            entry["address"] = address
            info = self._info(document, group)
            document["groups"][group] = replace(
                info, replicas=info.replicas | {entry["id"]}
            ).to_json()
            return int(entry["id"])

        broker_id = self._change(decide)
        self.liveness.beat(group, broker_id, address, epoch, max_offset, pid, zone)
        return broker_id, self._elect_if_needed(group, self.view(group), broker_id, leading)

    def heartbeat(
        self,
        group: str,
        broker_id: int,
        address: str,
        epoch: int,
        max_offset: int,
        pid: int = 0,
        leading: bool = True,
        zone: str = "",
        *,
        ack_quorum: int = 0,
        final_at_epoch: int = 0,
    ) -> GroupView:
        """Record the beat; elect if the group has no master, or if this is the master
        saying it does not lead (`leading=False`: it restarted) and it may hold less than a
        SyncStateSet member (`election.elect_master`). `ack_quorum` and `final_at_epoch`:
        as in BrokerHeartbeatRequest."""
        view = self.view(group)
        if broker_id not in view.info.replicas:
            raise UnknownBroker(f"broker {broker_id} is not registered in group {group!r}")
        self.ack_quorums[group] = ack_quorum
        self.liveness.beat(
            group, broker_id, address, epoch, max_offset, pid, zone, final_at_epoch=final_at_epoch
        )
        return self._elect_if_needed(group, view, broker_id, leading)

    def master_lost(self, group: str, master_id: int, epoch: int) -> GroupView:
        """Master `master_id` of `epoch` was found gone (a slave's stream from it broke and
        it failed the controller's probe): count it silent and elect now; nothing when the
        group has moved on meanwhile."""
        view = self.view(group)
        if view.info.master_id != master_id or view.info.master_epoch != epoch:
            return view
        self.liveness.lost(group, master_id)
        self.elect(group)
        return self.view(group)

    def _elect_if_needed(
        self, group: str, view: GroupView, broker_id: int, leading: bool
    ) -> GroupView:
        master = view.info.master_id
        if master is None:
            self.elect(group)
        elif master == broker_id and not leading:
            self.elect(group, not_leading=broker_id)
        else:
            return view
        return self.view(group)

    def elect(
        self, group: str, preferred: int | None = None, not_leading: int | None = None
    ) -> tuple[bool, Election]:
        """Elect now (a switchover when `preferred` is given): whether the stored state
        changed, and the election's outcome. `not_leading` is a broker that has just said it
        does not lead: if it is the master, it is weighed as one that restarted."""

        def decide(document: dict[str, Any]) -> tuple[bool, bool, Election]:
            info = self._info(document, group, must_exist=True)
            candidates = self.liveness.candidates(group, info.replicas)
            election = elect_master(
                info,
                candidates,
                preferred=preferred,
                unclean=self.unclean,
                master_leading=not_leading is None or info.master_id != not_leading,
                ack_quorum=self.ack_quorums.get(group, 0),
            )
            document["groups"][group] = election.info.to_json()
            new_epoch = election.info.master_epoch != info.master_epoch
            return election.info != info, new_epoch, election

        changed, new_epoch, election = self._change(decide)
        if changed:
            log.warning("group %s: %s", group, election.reason)
        if new_epoch:
            self.on_election(group)
        return changed, election

    def alter_sync_state_set(
        self,
        group: str,
        proposer_id: int,
        master_epoch: int,
        sync_state_set_epoch: int,
        new_set: frozenset[int],
    ) -> AlterResult:
        def decide(document: dict[str, Any]) -> AlterResult:
            info = self._info(document, group, must_exist=True)
            result = apply_alter_sync_state_set(
                info,
                proposer_id,
                master_epoch,
                sync_state_set_epoch,
                new_set,
                lambda broker_id: self.liveness.alive(group, broker_id),
            )
            document["groups"][group] = result.info.to_json()
            return result

        result = self._change(decide)
        if result.accepted:
            log.info("group %s: SyncStateSet now %s", group, sorted(result.info.sync_state_set))
        return result

    def check_masters(self, judge_unheard: bool = True) -> list[Election]:
        """Elect in every group whose master is dead or missing; the elections that changed
        something. Without `judge_unheard`, a master this controller has not heard from yet
        is left alone until another replica of its group has been beating for a whole
        timeout: just after a controller starts leading, brokers may still be finding it (on
        Kubernetes a replaced controller pod has a new address under its old name), and
        deposing a live master would fence it for nothing."""
        found: list[Election] = []
        before = self.liveness.now()
        groups = self._store.read().document.get("groups", {})
        if self.liveness.now() - before > self.liveness.timeout_s / 2:
            # The read took long, or this controller was stopped meanwhile (a SIGSTOP, a VM
            # pause): heartbeats sent meanwhile went unheard, so silence proves nothing now.
            return found
        for group in sorted(groups):
            info = ReplicaInfo.from_json(groups[group])
            master = info.master_id
            if master is not None and self.liveness.alive(group, master):
                continue
            if (
                master is not None
                and not judge_unheard
                and self.liveness.last(group, master) is None
                and not any(
                    self.liveness.heard_for(group, r) >= self.liveness.timeout_s
                    for r in info.replicas
                    if r != master
                )
            ):
                continue
            changed, election = self.elect(group)
            if changed:
                found.append(election)
        return found

    @staticmethod
    def _info(document: dict[str, Any], group: str, must_exist: bool = False) -> ReplicaInfo:
        raw = document["groups"].get(group)
        if raw is None:
            if must_exist:
                raise UnknownGroup(f"no broker of group {group!r} has registered")
            return ReplicaInfo(group)
        return ReplicaInfo.from_json(raw)
