"""What `capstan up` checks before it claims anything: that no other `capstan up` runs on
its data dir (an flock on `<data dir>/up.lock`, holding the owner's pid), that no child of
an earlier one still runs (the pids in `<data dir>/cluster.json`), and that every port it
would hand its children is free, so a second `capstan up` stops with one line instead of
starting children that die on busy ports and append to the first one's logs.

Children die with their `capstan up` (parent_death.py); one that could not act on it, being
stopped (SIGSTOP, a debugger) or hung, is still named here rather than as a busy port."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from capstan.common.errors import CapstanError
from capstan.common.listen import failure_message, probe

LOCK_FILE = "up.lock"
MANIFEST_FILE = "cluster.json"
CHILD_COMMANDS = ("broker", "controller")


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


def check_leftovers(data_dir: Path) -> None:
    """Refused, naming every process of an earlier `capstan up` on `data_dir` that still
    runs. A recorded pid counts only while its process runs a child's command with a config
    from this data dir: a pid the system has since given to another process is not blamed."""
    left = [(name, pid) for name, pid in _recorded(data_dir) if _runs_from(pid, data_dir)]
    if left:
        named = ", ".join(f"{name} (pid {pid})" for name, pid in left)
        pids = " ".join(str(pid) for _, pid in left)
        raise Refused(
            f"an earlier capstan up on {data_dir.resolve()} left processes running: {named}; "
            f"stop them first (kill {pids})"
        )


def child_config(argv: list[str]) -> str | None:
    """The `--config` of a command line that runs a child of `capstan up` (`… -m capstan.cli
    broker|controller … --config F`), else None."""
    for i in range(len(argv) - 2):
        if argv[i : i + 2] == ["-m", "capstan.cli"] and argv[i + 2] in CHILD_COMMANDS:
            rest = argv[i + 3 :]
            if "--config" in rest[:-1]:
                return rest[rest.index("--config") + 1]
    return None


def _recorded(data_dir: Path) -> list[tuple[str, int]]:
    """(name, pid) of each process the data dir's cluster.json names as running."""
    try:
        manifest = json.loads((data_dir / MANIFEST_FILE).read_text())
        processes = list(manifest["processes"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [
        (str(p.get("name")), p["pid"])
        for p in processes
        if isinstance(p, dict) and isinstance(p.get("pid"), int)
    ]


def _runs_from(pid: int, data_dir: Path) -> bool:
    proc = Path(f"/proc/{pid}")
    try:
        argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        cwd = (proc / "cwd").readlink()  # to resolve a relative --config
    except OSError:  # gone, or not ours to read
        return False
    config = child_config(argv)
    return config is not None and (cwd / config).resolve().parent == data_dir.resolve()


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
