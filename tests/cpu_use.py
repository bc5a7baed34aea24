"""Where the suite's CPU goes, file by file: with `CAPSTAN_TEST_CPU_LOG=PATH` set, each test
file's CPU time is appended to PATH as one line of JSON when its last test ends.

A file's figure is what its pytest worker used (user + system) plus what every process it
started and reaped used: brokers, controllers, `capstan up`, the CLI, Spark's JVM and
workers. Module fixtures count where they start and stop, in their file; session fixtures
(the control plane) count in the file whose test ended when they stopped. Containers of the
real node are not children of pytest and are not counted, nor is a process its parent left
running when it ended (orphaned, it is reaped by init): Spark's JVMs are mostly missed so (the
compaction job's file counted 9.5 CPU-s over 123 s). Used to decide what to cut
(docs/development.md, "Where the CPU goes")."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

LOG_VARIABLE = "CAPSTAN_TEST_CPU_LOG"


def cpu_seconds() -> float:
    """This process's CPU time and that of its reaped descendants."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        use = resource.getrusage(who)
        total += use.ru_utime + use.ru_stime
    return total


class FileCpu:
    """The pytest plugin: one JSON line per test file, {"file", "tests", "wall_s", "cpu_s"}."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.started: tuple[float, float] | None = None
        self.tests = 0

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Iterator[object]:
        if self.started is None:
            self.started = (time.monotonic(), cpu_seconds())
        try:
            return (yield)
        finally:
            self.tests += 1
            if nextitem is None or nextitem.path != item.path:
                wall0, cpu0 = self.started
                line = {
                    "file": item.nodeid.split("::", 1)[0],
                    "tests": self.tests,
                    "wall_s": round(time.monotonic() - wall0, 2),
                    "cpu_s": round(cpu_seconds() - cpu0, 2),
                }
                # One short write a line: the workers' lines interleave whole.
                with self.log.open("a") as out:
                    out.write(json.dumps(line) + "\n")
                self.started, self.tests = None, 0


def register(config: pytest.Config) -> None:
    path = os.environ.get(LOG_VARIABLE)
    if path:
        config.pluginmanager.register(FileCpu(Path(path)), "capstan-file-cpu")


def summary(lines: list[dict[str, object]], top: int = 15) -> str:
    """The files of a log, heaviest first: the `top` of them and the total."""
    rows = sorted(lines, key=lambda line: float(str(line["cpu_s"])), reverse=True)
    total = sum(float(str(line["cpu_s"])) for line in rows)
    out = [f"== CPU by test file: {total / 60:.1f} CPU-minutes in {len(rows)} files; heaviest:"]
    out += [f"{r['cpu_s']:>8} CPU-s {r['wall_s']:>8} s  {r['file']}" for r in rows[:top]]
    return "\n".join(out)


if __name__ == "__main__":
    import sys

    log_path = Path(sys.argv[1])
    if log_path.exists():
        print(summary([json.loads(line) for line in log_path.read_text().splitlines()]))
