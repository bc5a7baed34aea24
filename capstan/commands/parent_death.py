"""How a child of `capstan up` dies with it, however `capstan up` goes (kill -9 included).

`capstan up` names itself in each child's environment (`SUPERVISOR_ENV`); the child, as it
starts, asks Linux for SIGTERM, its orderly stop, once its parent is gone (prctl
PR_SET_PDEATHSIG). The child asks itself rather than in a preexec_fn: by then `capstan up`
runs gRPC's threads, and Python code between fork and exec in a threaded process can
deadlock. `capstan up` may die before the child asks; the child then finds another parent
than the one named and does not start.

The kernel sends the signal when the thread that started the child ends, not the process:
`capstan up` starts its children from its main thread only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

SUPERVISOR_ENV = "CAPSTAN_UP_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def supervised_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a child that is to die with this process."""
    return {**env, SUPERVISOR_ENV: str(os.getpid())}


def follow_supervisor() -> str | None:
    """In a child of `capstan up`: have the kernel stop it when `capstan up` dies. Returns
    why this process must not go on (`capstan up` is gone already), else None. Does nothing
    in a process not started by `capstan up`."""
    named = os.environ.pop(SUPERVISOR_ENV, None)  # not handed on to what this one starts
    if named is None:
        return None
    if sys.platform == "linux":
        _signal_on_parent_death(signal.SIGTERM)
    if os.getppid() != int(named):
        return f"capstan up (pid {named}), which started this process, has exited"
    return None


def _signal_on_parent_death(sig: signal.Signals) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
