"""A call a slave passed on to its master that answers nothing (SIGSTOP, a hung host) is
cancelled as soon as this replica's role changes and the master it named is no longer
the master, not at the forwarder's next periodic look (MOVE_CHECK_S): the call then goes
to the new master, or is served here, that much sooner."""

from __future__ import annotations

import asyncio
import time

import pytest

from capstan.broker.edge import forwarding
from capstan.broker.edge.forwarding import MasterMoved, _until_done_or_moved


class _Moves:
    """A replica's role changes, as ReplicaGroup.leadership_moved tells them."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def move(self) -> None:
        moved, self._event = self._event, asyncio.Event()
        moved.set()

    async def wait(self) -> None:
        await self._event.wait()


@pytest.mark.asyncio
async def test_a_role_change_cancels_a_call_to_the_old_master_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(forwarding, "MOVE_CHECK_S", 5.0)  # the periodic look comes late
    master = {"address": "old"}
    moves = _Moves()
    unanswered: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def elect_later() -> None:
        await asyncio.sleep(0.2)
        moves.move()  # a role change that leaves the master where it was: the call waits on
        await asyncio.sleep(0.2)
        master["address"] = "new"
        moves.move()

    election = asyncio.create_task(elect_later())
    began = time.monotonic()
    with pytest.raises(MasterMoved):
        await _until_done_or_moved(unanswered, lambda: master["address"] != "old", moves.wait)
    took = time.monotonic() - began
    await election
    assert unanswered.cancelled()  # the call to the old master is given up
    assert 0.35 <= took < 1.0, took


@pytest.mark.asyncio
async def test_a_call_answered_returns_whatever_the_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    moves = _Moves()
    answered: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.1, answered.set_result, "reply")
    await _until_done_or_moved(answered, lambda: False, moves.wait)
    assert answered.result() == "reply"
