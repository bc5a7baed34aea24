"""The rolling restart of one broker group, decided one step at a time.

Pods of a broker group are never restarted by the StatefulSet controller (its update
strategy is OnDelete); the operator's roller restarts them, in an order that keeps the
group writable, the way Strimzi's roller keeps every partition at min in-sync replicas:

0. Restart an outdated pod that cannot start (no image, no node, a crash loop) at once: it
   serves nothing, and only a restart gives it the fixed spec.
1. Wait while any pod is not running and ready, or while the controller has not seen every
   replica lately: a restart now could take the group below its minimum.
2. Restart outdated slaves first, one at a time, highest ordinal first, each only while the
   SyncStateSet without it still holds `min_in_sync` brokers.
3. When only the master is outdated, ask the controller to move leadership to an updated,
   caught-up slave in the SyncStateSet, and wait for a new epoch that names another master.
4. The old master is then a slave like any other, and step 2 restarts it.

`next_step` is pure: the operator gathers the pods (from the API server) and the group (from
the controller), applies what it returns, and asks again on its next round. Each answer
carries the reason a person would want in the resource's status.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class PodView:
    """One pod of the group, as the API server shows it."""

    name: str
    ordinal: int
    outdated: bool
    """Its revision is not the StatefulSet's update revision: it needs a restart."""
    ready: bool
    """Running, Ready and not being deleted."""
    stuck: bool = False
    """It cannot start: no image, no node, or a crash loop (operator/pod_problems.py)."""


@dataclass(frozen=True)
class GroupView:
    """The broker group, as the controller shows it, by pod name."""

    master: str | None
    """The pod whose broker is master, None while the group has none."""
    epoch: int
    sync_state_set: frozenset[str]
    """Pods whose brokers are in the SyncStateSet (caught up with the master)."""
    alive: frozenset[str]
    """Pods whose brokers beat the controller lately."""


class Action(Enum):
    WAIT = "wait"
    RESTART = "restart"
    """Delete the pod; the StatefulSet controller creates it again at the new revision."""
    SWITCH_MASTER = "switch_master"
    """Ask the controller to elect `pod` master, and wait for the new epoch."""
    DONE = "done"


@dataclass(frozen=True)
class Step:
    action: Action
    pod: str = ""
    reason: str = ""


def stuck_step(pods: Sequence[PodView]) -> Step | None:
    """An outdated pod that cannot start serves nothing, so restarting it costs nothing: it is
    how a fixed spec (a corrected image, less memory) reaches pods stuck on the broken one.
    Asked before anything else, and without the controller, which never saw such a pod."""
    stuck = sorted((p for p in pods if p.outdated and p.stuck), key=lambda p: -p.ordinal)
    if not stuck:
        return None
    pod = stuck[0].name
    return Step(Action.RESTART, pod, f"restarting {pod}: it cannot start and the spec changed")


def next_step(pods: Sequence[PodView], group: GroupView, min_in_sync: int) -> Step:
    """What to do next to bring every pod of the group to the update revision."""
    outdated = [p for p in pods if p.outdated]
    if not outdated:
        return Step(Action.DONE, reason="every pod runs the current revision")
    fix = stuck_step(pods)
    if fix is not None:
        return fix
    not_ready = sorted(p.name for p in pods if not p.ready)
    if not_ready:
        return Step(Action.WAIT, reason=f"waiting for {', '.join(not_ready)} to be ready")
    unseen = sorted(p.name for p in pods if p.name not in group.alive)
    if unseen:
        return Step(Action.WAIT, reason=f"waiting for the controller to see {', '.join(unseen)}")
    if group.master is None:
        return Step(Action.WAIT, reason="waiting for the group to have a master")
    slaves = sorted(
        (p for p in outdated if p.name != group.master), key=lambda p: p.ordinal, reverse=True
    )
    in_sync = group.sync_state_set
    for pod in slaves:
        remaining = len(in_sync - {pod.name})
        if remaining >= min_in_sync:
            return Step(
                Action.RESTART,
                pod.name,
                f"restarting slave {pod.name}: {remaining} of min {min_in_sync} stay in sync",
            )
    if slaves:
        names = ", ".join(p.name for p in slaves)
        return Step(
            Action.WAIT,
            reason=f"waiting for the SyncStateSet ({len(in_sync)}) to allow restarting "
            f"{names} with min {min_in_sync} in sync",
        )
    if len(pods) == 1:
        if min_in_sync > 1:
            return Step(Action.WAIT, reason="a single replica cannot keep min in sync")
        return Step(
            Action.RESTART,
            group.master,
            f"restarting {group.master}, the group's only replica: writes pause until it is back",
        )
    candidates = sorted(
        (p for p in pods if not p.outdated and p.name in in_sync and p.name != group.master),
        key=lambda p: p.ordinal,
    )
    if not candidates:
        return Step(
            Action.WAIT,
            reason=f"waiting for an updated slave to catch up before moving the master "
            f"off {group.master}",
        )
    target = candidates[0].name
    return Step(
        Action.SWITCH_MASTER,
        target,
        f"moving the master from {group.master} to {target} (epoch {group.epoch}) "
        "before restarting it",
    )
