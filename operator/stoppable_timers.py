"""Timers that give way at once when their object is being deleted.

Kopf runs a resource's deletion handlers and removes its finalizer only once the resource's
timers have returned, and it looks again at a timer that did not return at once only every
`settings.background.cancellation_polling` seconds (60 by default). A timer that is talking
to brokers which are themselves going (a namespace being deleted takes the pods first)
would hold the deletion that long. `unless_stopped` runs a timer's work and cancels it as
soon as Kopf signals the stop (the object deleted, or the operator pausing).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

# How often Kopf looks again at a timer that did not return at its stop (runtime.py).
STOP_POLLING_S = 1.0


async def unless_stopped(work: Coroutine[Any, Any, None], stopped: Any) -> bool:
    """Await `work`, or cancel it once `stopped` (the `stopped` kwarg Kopf gives timers;
    None for other handlers, which then simply await it) is set. True if it ran to its end."""
    if stopped is None:
        await work
        return True
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if task.done():
        task.result()  # its error, if it ended with one
        return True
    task.cancel()
    # Not awaited for good: a call that does not let itself be cancelled must not hold the
    # stop either (the task ends on its own later; its outcome is dropped).
    await asyncio.wait({task}, timeout=STOP_POLLING_S)
    if task.done() and not task.cancelled():
        with contextlib.suppress(Exception):
            task.result()
    return False
