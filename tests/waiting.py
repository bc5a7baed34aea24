"""Waiting in tests for something another process or thread does."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(check: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll `check` every 50 ms until it is truthy; AssertionError naming `what` after
    `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
