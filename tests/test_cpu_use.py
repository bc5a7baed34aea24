"""tests/cpu_use.py: with CAPSTAN_TEST_CPU_LOG set, each test file's CPU, its children's
included, is one JSON line; without it nothing is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests import cpu_use

REPO = Path(__file__).resolve().parents[1]

BUSY_CHILD = """
import subprocess, sys

def test_a_child_that_spins():
    spin = "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)

def test_a_quick_one():
    pass
"""


def _run(tmp_path: Path, log: Path | None) -> subprocess.CompletedProcess[str]:
    for name in ("test_one.py", "test_two.py"):
        (tmp_path / name).write_text(textwrap.dedent(BUSY_CHILD))
    run_pytest = (
        f"import sys; sys.path.append({str(REPO)!r}); import pytest; "
        f"sys.exit(pytest.main(['-q', '-p', 'tests.conftest', '-p', 'no:cacheprovider', "
        f"'--rootdir', {str(tmp_path)!r}, {str(tmp_path)!r}]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "CAPSTAN_TEST_CPU_LOG"}
    if log is not None:
        env["CAPSTAN_TEST_CPU_LOG"] = str(log)
    return subprocess.run(
        [sys.executable, "-c", run_pytest],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_each_file_gets_a_line_with_its_childrens_cpu(tmp_path: Path) -> None:
    log = tmp_path / "cpu.jsonl"
    done = _run(tmp_path, log)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["file"] for line in lines] == ["test_one.py", "test_two.py"]
    for line in lines:
        assert line["tests"] == 2
        assert line["cpu_s"] >= 0.4, line  # the child's spin, counted once it was reaped
        assert line["wall_s"] >= line["cpu_s"] * 0.5, line


def test_nothing_is_written_without_the_variable(tmp_path: Path) -> None:
    done = _run(tmp_path, None)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not list(tmp_path.glob("*.jsonl"))


def test_the_summary_puts_the_heaviest_first_and_sums_them() -> None:
    lines: list[dict[str, object]] = [
        {"file": "a.py", "tests": 1, "wall_s": 10.0, "cpu_s": 30.0},
        {"file": "b.py", "tests": 3, "wall_s": 50.0, "cpu_s": 90.0},
        {"file": "c.py", "tests": 2, "wall_s": 5.0, "cpu_s": 1.0},
    ]
    shown = cpu_use.summary(lines, top=2).splitlines()
    assert "2.0 CPU-minutes in 3 files" in shown[0]
    assert [row.split()[-1] for row in shown[1:]] == ["b.py", "a.py"]
