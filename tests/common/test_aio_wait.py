"""wait_event: a timed wait on an asyncio.Event that never loses a cancellation (Python
3.11's asyncio.wait_for does, when the event is set as the cancellation arrives)."""

from __future__ import annotations

import asyncio

from capstan.common.aio_wait import wait_event


def test_it_says_whether_the_event_was_set_or_the_time_ran_out():
    async def scenario() -> tuple[bool, bool]:
        event = asyncio.Event()
        timed_out = await wait_event(event, 0.01)
        asyncio.get_running_loop().call_later(0.01, event.set)
        return timed_out, await wait_event(event, 5)

    assert asyncio.run(scenario()) == (False, True)


def test_a_routine_cancelled_as_its_event_is_set_stops():
    """The shape of the controller link's and the timer's loops, stopped at the moment
    something wakes them: the stop that awaits the routine must not wait forever."""

    async def scenario() -> str:
        event = asyncio.Event()

        async def routine() -> None:
            while True:
                await wait_event(event, 10)
                event.clear()

        task = asyncio.create_task(routine())
        for _ in range(3):
            await asyncio.sleep(0)  # the routine is waiting now
        event.set()
        task.cancel()
        try:
            async with asyncio.timeout(2):
                await asyncio.shield(task)
        except asyncio.CancelledError:
            return "stopped"
        except TimeoutError:
            task.cancel()
            return "ran on: the cancellation was lost"
        return "returned"

    assert asyncio.run(scenario()) == "stopped"
