"""Running a server process in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import faulthandler
import io
import logging
import signal
import sys
from collections.abc import Callable
from typing import Protocol, TypeVar

from capstan.common.errors import CapstanError

log = logging.getLogger(__name__)

SLOW_STOP_DUMP_S = 15.0
"""A stop still running after this long writes every thread's and every asyncio task's
stack to the log, so a shutdown that hangs says where."""
STUCK_DUMP_S = 30.0
"""While serving, the event loop re-arms faulthandler's timer every STUCK_REARM_S; a loop
that has not for this long (its thread blocked, even inside C code holding the GIL, where
no Python thread can report it: capstan/common/loop_watch.py needs the GIL) has every
thread's stack written to stderr by faulthandler's own C thread. Longer than a SIGSTOP a
test or an operator gives a process, which would write it too."""
STUCK_REARM_S = 2.0


class Server(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=Server)


async def serve_until_signalled(server: S, on_ready: Callable[[S], None] | None = None) -> None:
    """Start `server`, call `on_ready`, wait for SIGTERM or SIGINT, then stop it cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except BaseException:
        await _stop_after_failed_start(server)
        raise
    if on_ready is not None:
        on_ready(server)
    rearming = asyncio.create_task(_rearm_stuck_dump(), name="stuck-dump")
    await stop.wait()
    log.info("signal received; stopping")
    rearming.cancel()
    faulthandler.dump_traceback_later(SLOW_STOP_DUMP_S)
    watchdog = asyncio.create_task(_report_slow_stop(SLOW_STOP_DUMP_S))
    try:
        await server.stop()
    finally:
        watchdog.cancel()


async def _rearm_stuck_dump() -> None:
    """Keep faulthandler's stack dump STUCK_DUMP_S ahead while the loop runs."""
    while True:
        faulthandler.dump_traceback_later(STUCK_DUMP_S, exit=False)
        await asyncio.sleep(STUCK_REARM_S)


async def _report_slow_stop(after_s: float) -> None:
    await asyncio.sleep(after_s)
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    log.warning("the stop still runs after %.0f s; its %d tasks:", after_s, len(tasks))
    for task in tasks:
        stack = io.StringIO()
        task.print_stack(file=stack)
        log.warning("%s", stack.getvalue())


async def _stop_after_failed_start(server: Server) -> None:
    """Release what a failed start opened (ports, the store's lock) while the loop runs:
    a gRPC server left to the garbage collector schedules its shutdown on a closed loop."""
    try:
        await server.stop()
    except Exception:  # the start's own error is the one to report
        log.debug("stopping after a failed start failed too", exc_info=True)


def run_in_foreground(server: S, on_ready: Callable[[S], None]) -> int:
    """`serve_until_signalled` as a command's body: 0 after a clean stop, 1 (the error on
    stderr) when the server could not start or failed."""
    # A fatal signal (SIGSEGV or SIGABRT in a C library) writes every thread's stack to
    # stderr before the process dies, rather than ending it without a word.
    faulthandler.enable()
    try:
        asyncio.run(serve_until_signalled(server, on_ready))
    except (CapstanError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        faulthandler.cancel_dump_traceback_later()
    return 0
