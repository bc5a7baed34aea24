"""Stepping aside before a stop (Kafka's controlled shutdown): a master told to stop moves
its leadership to a caught-up SyncStateSet member, and a slave leaves the SyncStateSet, so
the group's writes go on without the broker that is going.

Without it a master stopped by SIGTERM, as Kubernetes stops a pod on every rolling update,
would leave its group without a master until the controller misses its heartbeats. With
it, the stopping master:

1. closes the `LeadershipGate`: calls that arrive now wait at the gate instead of being
   served or passed on, and new writes wait before they are appended;
2. picks its successor (`choose_successor`): the live SyncStateSet member whose copy
   reaches furthest, and waits until that copy holds everything this master stored, so
   the switch loses nothing a producer was told was stored;
3. asks the controller for a switchover to it and takes the reply (this broker now follows
   the successor; the successor learns it leads as soon as its stream from here ends);
4. opens the gate once its own copy stream to the successor is accepted, which proves the
   successor leads: the calls that waited are passed on to it; and sends `Leave` on that
   stream, so the successor never counts it in its SyncStateSet.

Then the broker drains and stops as before. A slave in the SyncStateSet tells its master
it is leaving (`leave_sync_state_set`): the master proposes the set without it at once, so
writes stop waiting for its copy before its stream ends, rather than failing until the
master gives up on it (`ha_max_time_slave_not_catchup_ms`).

Every step is bounded by `handover_timeout_ms`; when a step fails (no member in sync, the
controller unreachable, the switchover refused) the broker stops as it would have without
it, the reason in its log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from capstan.broker.replication.controller_link import ControllerLink
from capstan.broker.replication.replica_group import ReplicaGroup, Role

log = logging.getLogger(__name__)

_POLL_S = 0.005
_BEAT_POLL_S = 0.05


def choose_successor(
    sync_state_set: frozenset[int], own_id: int, stored: Mapping[int, int]
) -> int | None:
    """The connected SyncStateSet member (never this master) holding the most, ties to
    the smallest id; None when no member is connected. `stored` maps each connected
    slave's id to the offset its copy reaches."""
    members = [(sid, offset) for sid, offset in stored.items() if sid in sync_state_set]
    members = [(sid, offset) for sid, offset in members if sid != own_id]
    if not members:
        return None
    return min(members, key=lambda m: (-m[1], m[0]))[0]


class LeadershipGate:
    """Where calls wait while leadership moves. Open except during a handover."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()

    @property
    def closed(self) -> bool:
        return not self._open.is_set()

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def passed(self) -> None:
        """Return once the gate is open (at once when it is)."""
        if not self._open.is_set():
            await self._open.wait()


async def _until(check: Callable[[], bool], deadline: float, poll_s: float = _POLL_S) -> bool:
    while not check():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll_s)
    return True


async def hand_over(
    group: ReplicaGroup,
    link: ControllerLink,
    gate: LeadershipGate,
    following: Callable[[], bool],
    leave: Callable[[], Awaitable[bool]] | None,
    timeout_s: float,
    successor: int | None = None,
) -> tuple[bool, str]:
    """Move the group's leadership away from this master (see the module docstring), to
    `successor` when given (a connected SyncStateSet member); `following()` tells whether
    this broker's copy stream from the new master is accepted, `leave()` tells the new
    master on that stream that this broker is going (None: it stays, a switchover).
    Returns whether the leadership moved, and what happened, for the log."""
    if group.role is not Role.MASTER or group.sync_state_set is None or timeout_s <= 0:
        return False, "not a controlled master: nothing to hand over"
    deadline = time.monotonic() + timeout_s
    gate.close()
    try:
        return await _hand_over_closed(group, link, following, leave, deadline, successor)
    finally:
        gate.open()


async def _hand_over_closed(
    group: ReplicaGroup,
    link: ControllerLink,
    following: Callable[[], bool],
    leave: Callable[[], Awaitable[bool]] | None,
    deadline: float,
    chosen: int | None,
) -> tuple[bool, str]:
    assert group.sync_state_set is not None
    stored = {sid: slave.stored_offset for sid, slave in group.links.items()}
    if chosen is not None:
        if chosen not in group.sync_state_set or chosen not in stored:
            return False, f"broker {chosen} is no connected SyncStateSet member"
        stored = {chosen: stored[chosen]}
    successor = choose_successor(group.sync_state_set, group.broker_id, stored)
    if successor is None:
        return False, f"no SyncStateSet member {sorted(group.sync_state_set)} is connected"

    def caught_up() -> bool:
        slave = group.links.get(successor)
        return slave is not None and slave.stored_offset >= group.store.max_phys_offset

    if not await _until(caught_up, deadline):
        return False, f"broker {successor} did not catch up in time"
    remaining = deadline - time.monotonic()
    changed, reason = await _bounded(link.switch_master(successor), remaining)
    if not changed:
        return False, f"the controller kept this master: {reason}"
    if not await _until(following, deadline):
        return True, f"handed over to broker {successor}, which did not take the lead in time"
    if leave is None:
        return True, f"handed over to broker {successor}"
    # Following the new master proved it leads; stay out of its SyncStateSet, which this
    # broker would otherwise join and then leave short as it stops, so that writes wait
    # for a copy that never comes.
    if not await leave():
        return True, f"handed over to broker {successor} (its stream ended before the Leave)"
    return True, f"handed over to broker {successor}"


async def _bounded(call: Awaitable[tuple[bool, str]], timeout_s: float) -> tuple[bool, str]:
    try:
        async with asyncio.timeout(max(timeout_s, 0.001)):  # not wait_for: common/aio_wait.py
            return await call
    except TimeoutError:
        return False, "no answer in time"


async def _fresh_reply(link: ControllerLink, deadline: float) -> bool:
    """Wait for a heartbeat reply sent after this call began."""
    before = link.replies

    def answered() -> bool:
        link.beat_soon()
        return link.replies > before

    return await _until(answered, deadline, _BEAT_POLL_S)


async def leave_sync_state_set(
    group: ReplicaGroup,
    link: ControllerLink,
    leave: Callable[[], Awaitable[bool]],
    timeout_s: float,
) -> str:
    """As a slave in the SyncStateSet, ask the master (through `leave()`, on the copy
    stream) to propose the set without this broker, and wait until the controller's answer
    shows it out. Returns what happened, for the log."""
    own = group.broker_id
    if group.role is not Role.SLAVE or link.info is None:
        return "not a slave under a controller: nothing to leave"
    if timeout_s <= 0:
        return "the handover is off: leaving the SyncStateSet to the master"
    deadline = time.monotonic() + timeout_s
    # The info at hand may predate this broker's joining the set: ask for a fresh one.
    if not await _fresh_reply(link, deadline):
        return "the controller did not answer in time: leaving the SyncStateSet to it"
    if own not in link.info.sync_state_set:
        return "not in the SyncStateSet: nothing to leave"
    if not await leave():
        return "no copy stream to tell the master: leaving the SyncStateSet to it"
    told = link.replies

    def left() -> bool:
        link.beat_soon()  # the answer carries the SyncStateSet as the controller has it
        return link.replies > told and link.info is not None and own not in link.info.sync_state_set

    if not await _until(left, deadline, _BEAT_POLL_S):
        return "the master did not drop this broker from the SyncStateSet in time"
    return "left the SyncStateSet"
