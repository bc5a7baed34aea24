"""A served process whose event loop stops (its thread blocked, however) has every
thread's stack written to stderr by faulthandler, without anything on the loop or in
Python having to run; a loop that runs keeps the dump from ever coming."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio, os, signal, time
    from capstan.common import lifecycle
    lifecycle.STUCK_DUMP_S = 1.0
    lifecycle.STUCK_REARM_S = 0.1

    def blocking_call_on_the_loop():
        time.sleep(3)  # a synchronous call made on the loop's thread

    class Server:
        async def start(self):
            pass

        async def stop(self):
            pass

    def ready(server):
        loop = asyncio.get_running_loop()
        if os.environ["BLOCK"] == "1":
            loop.call_later(0.5, blocking_call_on_the_loop)
        loop.call_later(4.0, os.kill, os.getpid(), signal.SIGTERM)

    asyncio.run(lifecycle.serve_until_signalled(Server(), ready))
    """
)


def _served(block: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONSAFEPATH": "1", "BLOCK": "1" if block else "0"},
    )


def test_a_blocked_loop_has_every_threads_stack_dumped() -> None:
    done = _served(block=True)
    assert done.returncode == 0, done.stderr
    assert "Timeout (0:00:01)!" in done.stderr
    assert "blocking_call_on_the_loop" in done.stderr


def test_a_loop_that_runs_gets_no_dump() -> None:
    done = _served(block=False)
    assert done.returncode == 0, done.stderr
    assert "Timeout" not in done.stderr
