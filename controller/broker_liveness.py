"""Which brokers are alive, from their heartbeats to the controller.

Kept in memory only: after a controller restart every broker counts as silent until its
next heartbeat, which errs on the side of not electing; and a master not heard from yet is
not deposed in the controller's first moments as leader (controller/server.py,
UNHEARD_GRACE_TIMEOUTS), while brokers find the new controller.
Keyed by (group, broker id).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from capstan.controller.election import Candidate


@dataclass(frozen=True)
class Beat:
    address: str
    epoch: int
    max_offset: int
    at_s: float
    """Monotonic time of the heartbeat."""
    pid: int = 0
    zone: str = ""
    """The zone (rack) the broker says it runs in; "" when it did not say."""
    final_at_epoch: int = 0
    """A slave following no master: the group's master epoch as it knew it; its
    max_offset stays until a master of a later epoch is named. 0: it follows or leads."""


class BrokerLiveness:
    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if timeout_s <= 0:
            raise ValueError(f"a heartbeat timeout must be positive, not {timeout_s}")
        self.timeout_s = timeout_s
        self._clock = clock
        self._beats: dict[tuple[str, int], Beat] = {}
        self._first: dict[tuple[str, int], float] = {}

    def beat(
        self,
        group: str,
        broker_id: int,
        address: str,
        epoch: int,
        max_offset: int,
        pid: int = 0,
        zone: str = "",
        *,
        final_at_epoch: int = 0,
    ) -> None:
        now = self._clock()
        self._beats[(group, broker_id)] = Beat(
            address, epoch, max_offset, now, pid, zone, final_at_epoch
        )
        self._first.setdefault((group, broker_id), now)

    def lost(self, group: str, broker_id: int) -> None:
        """The broker was found gone (its slave's stream broke and it failed a probe): it
        counts as silent from now until its next heartbeat."""
        beat = self._beats.get((group, broker_id))
        if beat is not None:
            silent_since = self._clock() - self.timeout_s - 1
            self._beats[(group, broker_id)] = dataclasses.replace(beat, at_s=silent_since)

    def now(self) -> float:
        """The clock heartbeats are timed by (monotonic seconds)."""
        return self._clock()

    def heard_for(self, group: str, broker_id: int) -> float:
        """Seconds since this controller first heard from the broker; -1 if it never has."""
        first = self._first.get((group, broker_id))
        return -1.0 if first is None else self._clock() - first

    def last(self, group: str, broker_id: int) -> Beat | None:
        return self._beats.get((group, broker_id))

    def alive(self, group: str, broker_id: int) -> bool:
        beat = self._beats.get((group, broker_id))
        return beat is not None and self._clock() - beat.at_s <= self.timeout_s

    def seconds_since(self, group: str, broker_id: int) -> float:
        """-1 when never heard of since this controller started."""
        beat = self._beats.get((group, broker_id))
        return -1.0 if beat is None else self._clock() - beat.at_s

    def candidates(self, group: str, broker_ids: frozenset[int]) -> dict[int, Candidate]:
        """What an election needs to know of each replica; unheard-of ones are left out
        (and so count as dead)."""
        found = {}
        for broker_id in broker_ids:
            beat = self._beats.get((group, broker_id))
            if beat is not None:
                alive = self.alive(group, broker_id)
                found[broker_id] = Candidate(
                    broker_id, alive, beat.epoch, beat.max_offset, beat.final_at_epoch
                )
        return found
