"""Scaling a broker group down, and deleting one, only when nothing acknowledged is at risk.

A StatefulSet shrinks from its highest ordinals. Before it may, the operator checks that
the replicas that stay keep the group writable: they include the master (else leadership
moves first, to a caught-up replica that stays) and at least `min_in_sync` of them are in
the SyncStateSet. A group is never scaled to no replica, and a group is only deleted once
drained: no unconsumed message, no half (transactional) message and no waiting timer.
Like the roller, the decisions are pure and explain themselves for the status.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from capstan.operator.roller import Action, GroupView, PodView, Step


@dataclass(frozen=True)
class Refusal:
    """A change the operator will not make; `reason` goes into a Degraded condition."""

    reason: str


def scale_down_step(
    pods: Sequence[PodView], desired: int, group: GroupView, min_in_sync: int
) -> Step | Refusal:
    """The next step towards `desired` replicas (fewer than now), or why not at all.

    RESTART here means: shrink the StatefulSet to `desired` (the pods past it go)."""
    if desired < 1:
        return Refusal("a broker group keeps at least one replica; delete the BrokerGroup instead")
    if desired < min_in_sync:
        return Refusal(
            f"replicas {desired} is below minInSyncReplicas {min_in_sync}: every write "
            "would be refused; lower minInSyncReplicas first"
        )
    ordered = sorted(pods, key=lambda p: p.ordinal)
    staying = {p.name for p in ordered[:desired]}
    leaving = [p.name for p in ordered[desired:]]
    if not leaving:
        return Step(Action.DONE, reason=f"the group has {len(pods)} replicas")
    if group.master is None:
        return Step(Action.WAIT, reason="waiting for the group to have a master")
    in_sync_staying = group.sync_state_set & staying
    if group.master not in staying:
        candidates = sorted(in_sync_staying - {group.master})
        if not candidates:
            return Step(
                Action.WAIT,
                reason=f"waiting for a replica that stays to catch up before moving the "
                f"master off {group.master}",
            )
        return Step(
            Action.SWITCH_MASTER,
            candidates[0],
            f"moving the master from {group.master}, which the scale-down removes, "
            f"to {candidates[0]}",
        )
    if len(in_sync_staying) < min_in_sync:
        return Step(
            Action.WAIT,
            reason=f"only {len(in_sync_staying)} of the replicas that stay are in sync; "
            f"minInSyncReplicas is {min_in_sync}",
        )
    return Step(
        Action.RESTART,
        ", ".join(leaving),
        f"removing {', '.join(leaving)}: {len(in_sync_staying)} in-sync replicas stay",
    )


@dataclass(frozen=True)
class Backlog:
    """What a group's brokers still hold for someone, from their admin API."""

    unconsumed: int
    """Messages behind the committed offsets of every consumer group, summed."""
    half_messages: int
    timers_waiting: int


def deletion_refusal(backlog: Backlog) -> Refusal | None:
    """Why a group may not be deleted yet, or None when it is drained."""
    held = []
    if backlog.unconsumed:
        held.append(f"{backlog.unconsumed} unconsumed message(s)")
    if backlog.half_messages:
        held.append(f"{backlog.half_messages} undecided transactional message(s)")
    if backlog.timers_waiting:
        held.append(f"{backlog.timers_waiting} delayed message(s) not yet due")
    if not held:
        return None
    return Refusal(
        f"the group still holds {', '.join(held)}: drain it first (set the topics' write "
        "queues to 0 and wait for consumers, transactions and timers to finish)"
    )
