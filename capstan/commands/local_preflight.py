"""What `capstan up` checks before it claims anything: that no other `capstan up` runs on
its data dir (an flock on `<data dir>/up.lock`, holding the owner's pid), and that every
port it would hand its children is free, so a second `capstan up` stops with one line
instead of starting children that die on busy ports and append to the first one's logs."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from capstan.common.errors import CapstanError
from capstan.common.listen import failure_message, probe

LOCK_FILE = "up.lock"


class Refused(CapstanError):
    """`capstan up` will not start: the message says why, in one line."""


@dataclass(frozen=True)
class PlannedPort:
    host: str
    port: int
    what: str
    """Whose port and for what, e.g. "broker-a-1's gRPC"."""


class DataDirLock:
    """Held for as long as `capstan up` runs; the kernel drops it when the process dies."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fd = -1

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise Refused(
                f"another capstan up (pid {holder}) is running on {self.path.parent.resolve()}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self, remove: bool = False) -> None:
        """With `remove`, the data dir this refused `capstan up` created goes too."""
        if self._fd >= 0:
            if remove:
                self.path.unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    self.path.parent.rmdir()
            os.close(self._fd)  # closing drops the flock
            self._fd = -1


def check_ports(ports: list[PlannedPort]) -> None:
    """Refused, naming the first port given twice or not free to listen on."""
    for port in ports:
        if not 0 < port.port <= 65535:
            raise Refused(f"{port.what} port would be {port.port}, outside 1..65535")
    counts = Counter(p.port for p in ports)
    twice = [p for p in ports if counts[p.port] > 1]
    if twice:
        uses = " and ".join(p.what for p in twice if p.port == twice[0].port)
        raise Refused(f"port {twice[0].port} would serve both {uses}; choose ports apart")
    for port in ports:
        cause = probe(port.host, port.port)
        if cause is not None:
            raise Refused(failure_message(cause, port.host, port.port, port.what))
