"""Waiting in tests for something another process or thread does."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO


def wait_until(check: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll `check` every 50 ms until it is truthy; AssertionError naming `what` after
    `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


STALL_S = 180.0
"""How long a process a slow test runs may print nothing before the test fails: longer than
any quiet stretch of a benchmark, a Spark job or an image build on a machine half as fast
as the development machine."""


def run_progressing(
    argv: Sequence[str],
    *,
    stall_s: float = STALL_S,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` to its end however long it takes while it keeps printing (stdout or
    stderr); once it has printed nothing for `stall_s`, kill its process group and fail
    naming the stall and what it printed last. A slow machine only waits longer."""
    proc = subprocess.Popen(
        list(argv), cwd=cwd, env=None if env is None else dict(env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    return finish_progressing(proc, stall_s)


def finish_progressing(
    proc: subprocess.Popen[str], stall_s: float = STALL_S
) -> subprocess.CompletedProcess[str]:
    """`run_progressing` for a process already started with text pipes for stdout and
    stderr in a session of its own (`start_new_session=True`)."""
    argv = proc.args if isinstance(proc.args, list) else [str(proc.args)]
    out: list[str] = []
    err: list[str] = []
    last = [time.monotonic()]

    def drain(stream: IO[str], into: list[str]) -> None:
        with stream:
            for line in stream:
                into.append(line)
                last[0] = time.monotonic()

    assert proc.stdout is not None and proc.stderr is not None
    readers = [
        threading.Thread(target=drain, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=drain, args=(proc.stderr, err), daemon=True),
    ]
    for reader in readers:
        reader.start()
    began = time.monotonic()
    while proc.poll() is None:
        if time.monotonic() - last[0] > stall_s:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for reader in readers:
                reader.join(timeout=10)
            tail = "".join(out[-10:] + err[-20:])[-3000:]
            raise AssertionError(
                f"{' '.join(map(str, argv[:4]))} ...: printed nothing for {stall_s:.0f} s,"
                f" {time.monotonic() - began:.0f} s in; its last lines:\n{tail}"
            )
        time.sleep(0.2)
    for reader in readers:
        reader.join(timeout=10)
    return subprocess.CompletedProcess(argv, proc.returncode, "".join(out), "".join(err))
