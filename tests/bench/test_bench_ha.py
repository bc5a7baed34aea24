"""`capstan bench ha --quick` as a user runs it: real controller and broker processes, its
table and its last line of JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.tiers import process_tool
from tests.waiting import run_progressing

pytestmark = [pytest.mark.slow, pytest.mark.chaos]


@process_tool
def bench(*args: str) -> subprocess.CompletedProcess[str]:
    """`capstan bench ...` in a process of its own, to its end while it shows progress."""
    return run_progressing(
        [sys.executable, "-m", "capstan.cli", "bench", *args],
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )


def test_the_ha_bench_runs_its_faults_and_loses_no_acknowledged_write(tmp_path):
    done = bench("ha", "--quick", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["bench"] == "ha" and figures["quick"] is True
    assert figures["acked_lost"] == 0 and figures["sigstop_acked_lost"] == 0
    assert figures["rolling_handover_failed_sends"] == 0
    for rate in ("sync_replicated_produce_msgs_per_s", "standalone_produce_msgs_per_s"):
        assert figures[rate] > 0, rate
    assert "ratio replicated / standalone" in done.stdout
    assert list(tmp_path.iterdir()) == []  # its processes' data is removed
