"""One child process of `capstan up`: its command, its log, its current process, and how it
went (restarts, why it last exited)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from capstan.commands.parent_death import supervised_env
from capstan.commands.restart_policy import RestartHistory

# Lines a dying Python process may print after the line that says what went wrong.
_NOISE = ("Event loop is closed", "was never awaited", "Task was destroyed", "Exception ignored")


@dataclass
class Child:
    name: str
    command: list[str]
    log: Path
    address: str
    http_port: int
    group: str = ""
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    log_start: int = 0
    """Where this run's output begins in the log (the log keeps earlier runs)."""
    history: RestartHistory = field(default_factory=RestartHistory)
    restart_at: float | None = None
    """When a restart is due; None while running, or once given up on."""
    handover_until: float | None = None
    """For a dead master: until when its restart waits for another replica to lead."""
    given_up: bool = False

    def start(self) -> None:
        """From the main thread only: the child is stopped when the thread that started it
        ends (parent_death.py)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            out.write(f"---- capstan up: {self.name} starting at {stamp} ----\n".encode())
            out.flush()
            self.log_start = out.tell()
            self.proc = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=supervised_env({**os.environ, "PYTHONSAFEPATH": "1"}),
                start_new_session=True,  # Ctrl-C reaches `capstan up`, which stops them in order
            )
        self.started_at = time.monotonic()
        self.restart_at = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running and self.proc is not None else None

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def exit_summary(self) -> str:
        """`code 1: <its last error line>`, or `code -9, SIGKILL` for a signal."""
        code = self.proc.returncode if self.proc is not None else None
        if code is not None and code < 0:
            try:
                return f"code {code}, {signal.Signals(-code).name}"
            except ValueError:
                return f"code {code}"
        last = self.last_line()
        return f"code {code}: {last}" if last else f"code {code}"

    def last_line(self) -> str:
        """The last line of this run's output that says something: its `error:` line if it
        printed one, else the last line that is not interpreter shutdown noise."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self.log_start)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        for line in reversed(lines):
            if line.startswith("error: "):
                return line.removeprefix("error: ")
        meaningful = [x for x in lines if not any(n in x for n in _NOISE)]
        return meaningful[-1] if meaningful else ""

    def terminate(self) -> None:
        if self.running and self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float) -> bool:
        """False when it had to be killed."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout_s)
            return True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return False
