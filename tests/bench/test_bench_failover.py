"""`capstan bench failover --quick` as a user runs it: real controller and broker processes,
every consumer kind through every fault, its table and its last line of JSON."""

from __future__ import annotations

import json

import pytest

from capstan.bench.failover_bench import FAULTS, KINDS
from tests.bench.test_bench_ha import bench

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(960)]


def test_the_failover_bench_measures_every_kind_through_every_fault_and_loses_nothing(tmp_path):
    done = bench("failover", "--quick", "--dir", str(tmp_path))
    # Its progress lines, then the processes' logs (the first group's last) and the error.
    assert done.returncode == 0, done.stdout[-2500:] + done.stderr[-30000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["bench"] == "failover" and figures["repetitions"] == 3
    assert figures["acknowledged"] > 1000
    for kind in KINDS:
        assert figures[f"{kind}_lost"] == 0, kind  # acknowledged and never consumed
        assert f"{kind}_duplicates" in figures
        for fault in FAULTS:
            # Every kind consumed again after every fault, within the bench's own limit.
            assert 0 <= figures[f"{fault}_{kind}_resume_s"] < 40, (fault, kind)
    assert all(f"{fault}_send_gap_s" in figures for fault in FAULTS)
    for kind in KINDS:
        assert kind in done.stdout  # the table has a row per kind
    assert list(tmp_path.iterdir()) == []  # its processes' data is removed
