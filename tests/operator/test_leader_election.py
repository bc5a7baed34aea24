"""The acting operator's hold on its Lease, with the API server replaced by a Lease whose
answers the test controls and the election's seconds scaled down to tenths."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from capstan.common.errors import CapstanError
from capstan.operator import leader_election
from capstan.operator.leader_election import LeaderElection


class ControlledLease:
    """Answers try_lead as told: held, refused with an error, or not at all until released."""

    where = "lease test/capstan-operator"

    def __init__(self) -> None:
        self.answer: str = "held"
        self.released = threading.Event()
        self.calls = 0

    def try_lead(self, holder: str, duration_s: float) -> bool:
        self.calls += 1
        if self.answer == "hang":
            self.released.wait(5)
            return True  # the API server's late answer: the renewal went through after all
        if self.answer == "error":
            raise CapstanError("the API server answered 503")
        return True


class Exited(Exception):
    pass


@pytest.fixture
def scaled(monkeypatch):
    """The election's constants in tenths of their seconds, and os._exit recorded."""
    monkeypatch.setattr(leader_election, "RENEW_S", 0.2)
    monkeypatch.setattr(leader_election, "RENEW_DEADLINE_S", 1.0)
    monkeypatch.setattr(leader_election, "DURATION_S", 1.5)
    monkeypatch.setattr(leader_election, "EXIT_MARGIN_S", 0.1)
    exits: list[tuple[int, float]] = []

    def record_exit(code: int) -> None:
        exits.append((code, time.monotonic()))
        raise Exited

    monkeypatch.setattr(leader_election.os, "_exit", record_exit)
    return exits


async def _lead_then(lease: ControlledLease, answer: str, exits: list) -> tuple[float, float]:
    """Lead, then have every renewal answer `answer`; when `lost` was set and when the
    process would have exited, in seconds since the last renewal that held."""
    election = LeaderElection(lease, "me")
    assert await election.wait_to_lead(asyncio.Event())
    lost = asyncio.Event()
    keeper = asyncio.create_task(election.keep(lost))
    await asyncio.sleep(0.5)  # a few renewals that hold
    lease.answer = answer
    await asyncio.wait_for(lost.wait(), 5)
    lost_at = time.monotonic()
    with pytest.raises(Exited):
        await asyncio.wait_for(keeper, 5)
    lease.released.set()  # the hanging call's thread ends, so the loop can close
    assert election.renewed_at is not None
    last = election.renewed_at
    return lost_at - last, exits[0][1] - last


@pytest.mark.parametrize("answer", ["error", "hang"])
def test_a_leader_whose_renewals_fail_or_hang_stops_by_its_deadline_and_exits_before_the_lapse(
    scaled, answer
):
    """Whether the API server refuses each renewal or leaves it hanging (a partition: each
    call waits out its request timeout), the leader stops acting at its renew deadline and
    its process ends before the Lease it last renewed could lapse for a standby."""
    lost_s, exited_s = asyncio.run(_lead_then(ControlledLease(), answer, scaled))
    assert 1.0 <= lost_s < 1.0 + 0.2, lost_s  # the deadline, within one renewal's wait
    assert exited_s < 1.5, exited_s  # before the lapse
    assert scaled[0][0] == 3
