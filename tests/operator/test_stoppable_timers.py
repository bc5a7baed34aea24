"""A timer's work gives way to its object's deletion: Kopf's own stop flag, as it sets it."""

from __future__ import annotations

import asyncio
import time

import pytest
from kopf._core.intents.stoppers import DaemonStopper, DaemonStoppingReason

from capstan.operator.stoppable_timers import unless_stopped


def test_work_stopped_midway_is_cancelled_and_the_timer_returns_at_once() -> None:
    async def scenario() -> tuple[bool, bool, float]:
        stopper = DaemonStopper()
        cancelled = asyncio.Event()

        async def a_call_to_stopping_brokers() -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        loop = asyncio.get_running_loop()
        loop.call_later(0.2, lambda: stopper.set(reason=DaemonStoppingReason.RESOURCE_DELETED))
        began = time.monotonic()
        finished = await unless_stopped(a_call_to_stopping_brokers(), stopper.async_waiter)
        return finished, cancelled.is_set(), time.monotonic() - began

    finished, cancelled, took = asyncio.run(scenario())
    assert not finished and cancelled
    assert took < 1.5


def test_work_that_ends_first_gives_its_outcome_and_its_error() -> None:
    async def fine() -> None:
        await asyncio.sleep(0.01)

    async def broken() -> None:
        raise RuntimeError("the brokers said no")

    async def scenario() -> bool:
        return await unless_stopped(fine(), DaemonStopper().async_waiter)

    assert asyncio.run(scenario()) is True
    with pytest.raises(RuntimeError, match="said no"):
        asyncio.run(unless_stopped(broken(), DaemonStopper().async_waiter))
    assert asyncio.run(unless_stopped(fine(), None)) is True  # an update handler: no flag


def test_work_that_will_not_be_cancelled_does_not_hold_the_stop() -> None:
    async def scenario() -> float:
        stopper = DaemonStopper()
        stopper.set(reason=DaemonStoppingReason.RESOURCE_DELETED)

        async def stubborn() -> None:
            for _ in range(30):
                try:
                    await asyncio.sleep(0.1)
                except asyncio.CancelledError:
                    continue  # swallows every cancellation, as a careless call might

        began = time.monotonic()
        await unless_stopped(stubborn(), stopper.async_waiter)
        return time.monotonic() - began

    assert asyncio.run(scenario()) < 2  # it would go on for 3 s
