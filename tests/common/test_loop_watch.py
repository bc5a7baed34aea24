"""The loop watch says when a server's event loop stops running, and where: a callback
that blocks the loop's thread is named in the log, once per blockage, and the loop running
again is said too; a process that was stopped as a whole is not taken for a blocked loop."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from capstan.common.loop_watch import LoopWatch


def _blocking_call_on_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # what a synchronous call made on the loop's thread does


@pytest.mark.asyncio
async def test_a_blocked_loop_is_named_with_where_it_is_and_its_return_is_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="capstan.common.loop_watch")
    watch = LoopWatch(asyncio.get_running_loop(), blocked_s=0.3, check_s=0.05)
    watch.start()
    try:
        await asyncio.sleep(0.5)  # a loop that runs is not reported
        assert watch.blockages == 0 and not caplog.records
        _blocking_call_on_the_loop(1.2)
        await asyncio.sleep(0.3)
        assert watch.blockages == 1
        blocked = [r.getMessage() for r in caplog.records if "has not run" in r.getMessage()]
        assert len(blocked) == 1  # once per blockage, not at every check
        assert "_blocking_call_on_the_loop" in blocked[0]
        back = [r.getMessage() for r in caplog.records if "runs again" in r.getMessage()]
        assert len(back) == 1
        lasted = float(back[0].split("after ")[1].split(" s")[0])
        assert 0.9 <= lasted <= 2.0
    finally:
        watch.stop()


def test_a_stopped_process_is_not_taken_for_a_blocked_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="capstan.common.loop_watch")
    clock = [100.0]
    loop = asyncio.new_event_loop()
    try:
        watch = LoopWatch(loop, blocked_s=0.3, check_s=0.05, clock=lambda: clock[0])
        watch.start()
        time.sleep(0.2)  # the loop never runs here: only a moved clock could tell it apart
        clock[0] += 10.0  # the whole process, this thread included, stopped for 10 s
        time.sleep(0.2)
        watch.stop()
    finally:
        loop.close()
    said = [r.getMessage() for r in caplog.records]
    assert any("did not run for 10.0 s" in m for m in said), said
    assert watch.blockages == 0
