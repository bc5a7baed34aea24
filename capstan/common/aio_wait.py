"""Waiting in asyncio without losing a cancellation.

On Python 3.11, `asyncio.wait_for` returns the awaited result when a cancellation arrives
just as that result does, and the cancellation is lost (CPython gh-86296, fixed in 3.12).
A background routine looping on `wait_for(event.wait(), t)`, cancelled by a stop at the
moment something sets its event, then runs on, and the stop that awaits it waits forever
(a broker once hung on SIGTERM that way). `asyncio.timeout` has no such window, so every
timed wait in Capstan goes through it.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until `event` is set or `timeout_s` seconds pass; whether it was set."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
