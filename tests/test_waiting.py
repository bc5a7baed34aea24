"""The waits bounded by progress, not by a guess at the machine's speed: a process that
keeps printing, or work whose snapshot keeps changing, is waited for past any stall bound;
one that stops is failed once the bound has passed, saying where it stood."""

from __future__ import annotations

import itertools
import sys
import time

import pytest
from e2e.cluster import wait_progressing

from tests.waiting import run_progressing

TICKS = "import time\nfor i in range({n}):\n    print(i, flush=True)\n    time.sleep({every})\n"


def test_a_process_that_keeps_printing_runs_past_the_stall_bound_to_its_end():
    began = time.monotonic()
    done = run_progressing([sys.executable, "-c", TICKS.format(n=8, every=0.3)], stall_s=1.0)
    assert time.monotonic() - began > 2.0  # well past the bound, never killed
    assert done.returncode == 0
    assert done.stdout.split() == [str(i) for i in range(8)]


def test_a_process_that_goes_quiet_is_killed_once_the_bound_passes_naming_its_last_lines():
    quiet = "import sys, time\nprint('reading queue 3', flush=True)\ntime.sleep(60)\n"
    began = time.monotonic()
    with pytest.raises(AssertionError, match=r"printed nothing for 1 s(.|\n)*reading queue 3"):
        run_progressing([sys.executable, "-c", quiet], stall_s=1.0)
    assert time.monotonic() - began < 10


def test_a_wait_goes_on_while_its_snapshot_changes_and_fails_once_it_stays_the_same():
    counter = itertools.count()
    moving = wait_progressing(
        "counting", lambda: (n := next(counter)) >= 15 and n, lambda: time.monotonic(),
        stall_s=0.5, poll_s=0.1,
    )  # fmt: skip
    assert moving >= 15  # 1.5 s of polls, three times the stall bound
    began = time.monotonic()
    with pytest.raises(
        AssertionError, match=r"the pods Ready: nothing progressed .*stuck at: 'Pending'"
    ):
        wait_progressing("the pods Ready", lambda: None, lambda: "Pending", 0.5, 0.1)
    assert time.monotonic() - began < 5
