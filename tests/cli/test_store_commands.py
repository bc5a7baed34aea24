"""`capstan store check|queues`: what a person or a script sees, through the real command."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from tests.store.conftest import make_message, open_store


def capstan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import sys; from capstan.cli import main; sys.exit(main())", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_queues_lists_bounds_as_json_and_table(tmp_path: pathlib.Path) -> None:
    with open_store(tmp_path) as store:
        store.put([make_message(i, queue_id=i % 2) for i in range(7)])
    out = capstan("store", "queues", "--data-dir", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["queues"]
    assert rows == [
        {"topic": "Orders", "queue_id": 0, "min_offset": 0, "max_offset": 4},
        {"topic": "Orders", "queue_id": 1, "min_offset": 0, "max_offset": 3},
    ]
    table = capstan("store", "queues", "--data-dir", str(tmp_path))
    assert "Orders" in table.stdout and table.stdout.splitlines()[0].split() == [
        "TOPIC",
        "QUEUE",
        "MIN",
        "MAX",
    ]


def test_check_reports_recovery(tmp_path: pathlib.Path) -> None:
    with open_store(tmp_path) as store:
        store.put([make_message(i) for i in range(3)])
    out = capstan("store", "check", "--data-dir", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["crashed"] is False and report["truncated_bytes"] == 0
    assert "after a clean stop" in capstan("store", "check", "--data-dir", str(tmp_path)).stdout


def test_check_on_a_store_in_use_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    with open_store(tmp_path):
        out = capstan("store", "check", "--data-dir", str(tmp_path))
    assert out.returncode == 1
    assert "already open in another process" in out.stderr and "Traceback" not in out.stderr


def test_check_on_a_missing_store_creates_nothing(tmp_path: pathlib.Path) -> None:
    out = capstan("store", "check", "--data-dir", str(tmp_path / "nowhere"))
    assert out.returncode == 1 and "holds no Capstan store" in out.stderr
    assert not (tmp_path / "nowhere").exists()
