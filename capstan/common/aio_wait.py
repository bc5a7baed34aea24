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


def awaited_stack(task: asyncio.Task[object], limit: int = 40) -> list[str]:
    """Where `task` waits, outermost first, one line per coroutine of the chain it awaits
    through (Task.print_stack shows only the outermost frame of a suspended task), ending
    at the future it waits on; a task it awaits is followed into."""
    lines: list[str] = []
    awaited: object = task.get_coro()
    while awaited is not None and len(lines) < limit:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is not None:
            code = frame.f_code
            lines.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        elif isinstance(awaited, asyncio.Task):
            lines.append(f"(the task {awaited.get_name()!r})")
            awaited = awaited.get_coro()
        else:
            lines.append(f"(waiting on {type(awaited).__name__})")
            break
    return lines
