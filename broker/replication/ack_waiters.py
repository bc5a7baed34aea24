"""The master's one table of writes waiting for their copies.

A write appended to the CommitLog waits here until enough slaves have acknowledged the
offset where it ends (`ack_policy.acks_reached`), or until the slave timeout. Each ack a
slave sends wakes every write it settles, so many writes in flight cost one table, not one
polling loop each. Use from the broker's event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from capstan.broker.replication.ack_policy import AckOutcome, acks_reached


@dataclass(slots=True)
class _Waiter:
    target: int
    need: int
    done: asyncio.Future[AckOutcome]


class AckWaiters:
    def __init__(
        self, sync_state_set: Callable[[], frozenset[int] | None], quorum: bool = False
    ) -> None:
        """`sync_state_set()` is the SyncStateSet as it is now (all-ack or quorum mode), or
        None when any slave's ack counts; with `quorum` a write's `need` copies among its
        members settle it (`ack_policy.acks_reached`)."""
        self._sync_state_set = sync_state_set
        self._quorum = quorum
        self.acked: dict[int, int] = {}
        self._waiting: list[_Waiter] = []

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def record(self, slave_id: int, offset: int) -> None:
        """A slave holds everything below `offset`; settle the writes that now have their
        copies."""
        if offset <= self.acked.get(slave_id, -1):
            return
        self.acked[slave_id] = offset
        self.recheck()

    def forget(self, slave_id: int) -> None:
        """The slave's stream ended: its acks no longer count."""
        self.acked.pop(slave_id, None)

    def recheck(self) -> None:
        """Settle what the current acks and SyncStateSet allow (also after the set changed)."""
        if not self._waiting:
            return
        members = self._sync_state_set()
        still = []
        for waiter in self._waiting:
            if acks_reached(waiter.target, waiter.need, self.acked, members, self._quorum):
                waiter.done.set_result(AckOutcome.PUT_OK)
            else:
                still.append(waiter)
        self._waiting = still

    async def wait(self, target: int, need: int, timeout_s: float) -> AckOutcome:
        """Until `need` copies (the master's included) hold every byte below `target`:
        PUT_OK, or FLUSH_SLAVE_TIMEOUT after `timeout_s`."""
        if acks_reached(target, need, self.acked, self._sync_state_set(), self._quorum):
            return AckOutcome.PUT_OK
        done: asyncio.Future[AckOutcome] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(target, need, done)
        self._waiting.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: see common/aio_wait.py
                return await asyncio.shield(done)
        except TimeoutError:
            return AckOutcome.FLUSH_SLAVE_TIMEOUT
        finally:
            if not done.done():  # timed out or cancelled: it waits no more
                done.cancel()
                self._waiting.remove(waiter)

    def lower_need(self, copies: int) -> None:
        """The SyncStateSet shrank to `copies` members, the controller recording it, because
        a member stopped acknowledging: the writes waiting settle for the set as it is now
        (as RocketMQ's do), rather than wait for a copy the controller no longer counts."""
        for waiter in self._waiting:
            waiter.need = max(1, min(waiter.need, copies))
        self.recheck()

    def fail_needing_more_than(self, copies: int, outcome: AckOutcome) -> int:
        """Fail the writes that need more than `copies` copies (the most that can still
        answer): they could only time out. How many failed."""
        failed = [w for w in self._waiting if w.need > copies and not w.done.done()]
        for waiter in failed:
            waiter.done.set_result(outcome)
        self._waiting = [w for w in self._waiting if not w.done.done()]
        return len(failed)

    def fail_all(self, outcome: AckOutcome = AckOutcome.FLUSH_SLAVE_TIMEOUT) -> int:
        """This broker stopped being the master: no waiting write is acknowledged."""
        count = 0
        for waiter in self._waiting:
            if not waiter.done.done():
                waiter.done.set_result(outcome)
                count += 1
        self._waiting = []
        return count
