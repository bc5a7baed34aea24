"""The master's side of the SyncStateSet: which replicas it asks the controller to count as
holding every confirmed message, and what consumers may read.

The master *proposes* a new set from what its slaves acknowledged; the controller applies
it only if the proposal is current (`capstan.controller.sync_state`). A consumer may read up
to `confirm_offset`: the messages every member holds. Both are pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SlaveProgress:
    """What the master knows of one connected slave.

    `acked_offset` is the CommitLog offset the slave has confirmed; `last_caught_up_s` (wall
    clock, seconds) the last time that offset reached the master's max offset; `epoch` the
    last master epoch in the slave's epoch file: a slave still on an older epoch may hold a
    divergent tail it has not truncated yet.
    """

    acked_offset: int
    last_caught_up_s: float
    epoch: int


def propose_sync_state_set(
    sync_state_set: frozenset[int],
    master_id: int,
    slaves: Mapping[int, SlaveProgress],
    confirm_offset: int,
    now_s: float,
    max_time_not_catchup_s: float,
    master_epoch: int,
) -> frozenset[int] | None:
    """The set the master should ask the controller for, or None if the current one stands.

    A member is dropped once it has not caught up for longer than `max_time_not_catchup_s`
    or has disconnected, so a slow slave cannot hold back every consumer. A slave joins when
    it holds everything confirmed, is on the master's epoch, and is not itself lagging (so it
    would not be dropped again by the very next proposal). The master always stays.
    """
    deadline_s = now_s - max_time_not_catchup_s
    kept = {m for m in sync_state_set if _keeps_up(slaves.get(m), deadline_s)}
    joining = {
        slave_id
        for slave_id, progress in slaves.items()
        if _may_join(progress, confirm_offset, master_epoch, deadline_s)
    }
    proposed = frozenset(kept | joining | {master_id})
    return None if proposed == sync_state_set else proposed


def _keeps_up(progress: SlaveProgress | None, deadline_s: float) -> bool:
    return progress is not None and progress.last_caught_up_s >= deadline_s


def _may_join(
    progress: SlaveProgress, confirm_offset: int, master_epoch: int, deadline_s: float
) -> bool:
    return (
        progress.acked_offset >= confirm_offset
        and progress.epoch == master_epoch
        and _keeps_up(progress, deadline_s)
    )


def confirm_offset(
    master_max_offset: int,
    sync_state_set: frozenset[int],
    master_id: int,
    acked: Mapping[int, int],
) -> int:
    """The offset every SyncStateSet member holds: consumers may never read past it, since a
    message beyond it could vanish when a member that lacks it is elected master. A member
    that has acknowledged nothing counts as 0; the master counts with its own max offset."""
    slaves = [acked.get(m, 0) for m in sync_state_set if m != master_id]
    return min([master_max_offset, *slaves])
