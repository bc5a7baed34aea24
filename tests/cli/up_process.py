"""`capstan up` as a real child process for tests: its output gathered as it comes, the
ports it was given, its cluster.json, its children found in /proc, and a SIGTERM stop."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from capstan.commands.parent_death import SUPERVISOR_ENV
from tests.broker.broker_process import free_port, free_port_run
from tests.tiers import process_tool
from tests.waiting import wait_until

READY_TIMEOUT_S = 60.0


@process_tool
class UpProcess:
    def __init__(
        self, data_dir: Path, replicas: int = 2, groups: int = 1, secure: bool = False
    ) -> None:
        self.data_dir = data_dir
        self.secure = secure
        self.replicas = replicas
        self.groups = groups
        self.port = free_port_run(groups * replicas)
        self.http_port = free_port_run(groups * replicas + 1)
        self.controller_port = free_port()
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._ended = True

    @property
    def args(self) -> list[str]:
        return [
            "--port", str(self.port),
            "--http-port", str(self.http_port),
            "--controller-port", str(self.controller_port),
            "--data-dir", str(self.data_dir),
            "--replicas", str(self.replicas),
            "--groups", str(self.groups),
            *(["--secure"] if self.secure else []),
        ]  # fmt: skip

    @property
    def access_point(self) -> str:
        return f"127.0.0.1:{self.controller_port}"

    def start(self) -> UpProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "capstan.cli", "up", *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONSAFEPATH": "1"},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            self.wait_for("Stop with Ctrl-C", READY_TIMEOUT_S)
        except AssertionError:
            self.stop()
            raise
        return self

    def start_in_terminal(self) -> int:
        """Start it as a terminal runs a command, with a pseudo-terminal as its controlling
        terminal (`setsid --ctty`); its output is read until it is up, not after. Returns
        the terminal's master end: closing it hangs the terminal up, as closing a terminal
        window does, and the kernel sends SIGHUP to `capstan up`."""
        master, slave = os.openpty()
        self.proc = subprocess.Popen(
            ["setsid", "--ctty", sys.executable, "-m", "capstan.cli", "up", *self.args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            text=True,
            env={**os.environ, "PYTHONSAFEPATH": "1"},
        )
        os.close(slave)
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while not any("Stop with Ctrl-C" in x for x in self.lines):
                assert time.monotonic() < deadline and self.running, self.output()
                if select.select([master], [], [], 0.5)[0]:
                    self._take(os.read(master, 4096).decode(errors="replace"))
        except BaseException:
            os.close(master)
            self.stop()
            raise
        return master

    def _take(self, text: str) -> None:
        """Terminal output: lines end in CR LF, the last one may be incomplete."""
        partial = self.lines.pop() if self.lines and not self._ended else ""
        lines = (partial + text.replace("\r\n", "\n")).split("\n")
        self._ended = lines[-1] == ""
        self.lines.extend(lines[:-1] if self._ended else lines)

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout_s: float) -> str:
        """The first line holding `text`, once it has been printed."""
        wait_until(
            lambda: any(text in x for x in self.lines) or not self.running,
            timeout_s,
            f"{text!r} from capstan up; it printed:\n{self.output()}",
        )
        found = [x for x in self.lines if text in x]
        assert found, f"capstan up exited without {text!r}:\n{self.output()}"
        return found[0]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def manifest(self) -> dict[str, Any]:
        return dict(json.loads((self.data_dir / "cluster.json").read_text()))

    def pid_of(self, address: str) -> int | None:
        by_address = {p["address"]: p["pid"] for p in self.manifest()["processes"]}
        return by_address[address]

    def child_pids(self) -> list[int]:
        return [p["pid"] for p in self.manifest()["processes"] if p["pid"]]

    def still_running(self, pids: list[int]) -> list[int]:
        """Those of `pids` that are still children of this data dir's cluster (alive, not a
        zombie, and started with a config from the data dir: a pid taken again by another
        process does not count)."""
        return [pid for pid in pids if runs_from(pid, self.data_dir)]

    def _kill_children(self) -> None:
        if not (self.data_dir / "cluster.json").exists():
            return
        for pid in self.still_running(self.child_pids()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self, timeout_s: float = 60) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            self._kill_children()  # never leave a cluster behind, even when a test fails
            if self._reader is not None:
                self._reader.join(10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        return code


def runs_from(pid: int, data_dir: Path) -> bool:
    """Whether `pid` is a live process (not a zombie) whose command line names `data_dir`."""
    proc = Path(f"/proc/{pid}")
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except (OSError, IndexError):
        return False
    return state != "Z" and any(str(data_dir) in arg for arg in argv)


@process_tool
def run_as_child_of(supervisor_pid: int, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `capstan ARGS` as if `capstan up` (pid `supervisor_pid`) had started it."""

    return subprocess.run(
        [sys.executable, "-m", "capstan.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONSAFEPATH": "1", SUPERVISOR_ENV: str(supervisor_pid)},
        timeout=60,
    )
