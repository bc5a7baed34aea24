"""The controller's side of the SyncStateSet: the replicas known to hold every message the
master confirmed.

Only a member of this set may be elected master without losing confirmed messages, so it is
changed in two steps. The master *proposes* a new set from what its slaves acknowledged
(`capstan.broker.replication.sync_state_set`); the controller *applies* it here only if the
proposal comes from the current master and was built on the current set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from capstan.controller.replica_info import ReplicaInfo, format_ids


@dataclass(frozen=True)
class AlterResult:
    """The controller's answer to a proposal: accepted or not, the state to persist (the old
    one when refused), and why, for the master's log and the operator."""

    accepted: bool
    info: ReplicaInfo
    reason: str


def apply_alter_sync_state_set(
    info: ReplicaInfo,
    proposer_id: int,
    proposer_master_epoch: int,
    proposer_sync_state_set_epoch: int,
    new_set: frozenset[int],
    alive: Callable[[int], bool],
) -> AlterResult:
    """Apply a master's proposal, or refuse it with the reason.

    Both epochs must match: the master epoch fences a deposed master that has not noticed
    yet, the SyncStateSet epoch a proposal built on a set that changed since. A newcomer to
    the set must be alive, or a dead replica could become electable. A proposal equal to the
    current set is accepted without a new epoch, so a retried request does no harm.
    """
    refusal = _proposer_refusal(info, proposer_id, proposer_master_epoch)
    refusal = refusal or _set_refusal(info, proposer_sync_state_set_epoch, new_set, alive)
    if refusal is not None:
        return AlterResult(False, info, refusal)
    old = format_ids(info.sync_state_set)
    if new_set == info.sync_state_set:
        return AlterResult(True, info, f"the SyncStateSet is already {old}")
    altered = replace(
        info, sync_state_set=new_set, sync_state_set_epoch=info.sync_state_set_epoch + 1
    )
    reason = f"SyncStateSet {old} -> {format_ids(new_set)} at epoch {altered.sync_state_set_epoch}"
    return AlterResult(True, altered, reason)


def _proposer_refusal(info: ReplicaInfo, proposer_id: int, master_epoch: int) -> str | None:
    if info.master_id != proposer_id:
        master = "it has no master" if info.master_id is None else f"it is {info.master_id}"
        return f"broker {proposer_id} is not the master of {info.group!r}; {master}"
    if master_epoch != info.master_epoch:
        return (
            f"broker {proposer_id} proposes at master epoch {master_epoch} but the current one"
            f" is {info.master_epoch}: a deposed master is fenced"
        )
    return None


def _set_refusal(
    info: ReplicaInfo, set_epoch: int, new_set: frozenset[int], alive: Callable[[int], bool]
) -> str | None:
    proposed = format_ids(new_set)
    if set_epoch != info.sync_state_set_epoch:
        return (
            f"the proposal was built on SyncStateSet epoch {set_epoch} but the current one is"
            f" {info.sync_state_set_epoch}; re-read the SyncStateSet and propose again"
        )
    if info.master_id not in new_set:
        return f"the proposed SyncStateSet {proposed} lacks the master {info.master_id}"
    strangers = new_set - info.replicas
    if strangers:
        names = format_ids(strangers)
        return f"the proposed SyncStateSet {proposed} names unregistered brokers {names}"
    dead = {i for i in new_set - info.sync_state_set if not alive(i)}
    if dead:
        return f"brokers {format_ids(dead)} would join the SyncStateSet but are not alive"
    return None
