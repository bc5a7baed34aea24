"""The heavy things a pytest worker shares (tests/worker_shared.py): each kind's files in one
scheduling unit, and each stopped once the tests that follow do not ask for it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import worker_shared
from tests.worker_shared import CONTROL_PLANE, KINDS, SPARK, FilesTogether, Shared

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Item:
    path: Path
    fixturenames: list[str] = field(default_factory=list)


def scope_of(nodeid: str) -> str:
    scheduler = FilesTogether.__new__(FilesTogether)
    return scheduler._split_scope(nodeid)


def test_the_control_planes_files_are_one_unit_and_the_others_go_by_file() -> None:
    for kind in KINDS:
        for file in kind.files:
            assert (REPO / file).is_file(), file
            together = scope_of(f"{file}::test_x[kubernetes]") == kind.scope
            assert together == kind.together, file
    assert CONTROL_PLANE.together and not SPARK.together
    assert scope_of("tests/store/test_crash.py::test_kill") == "tests/store/test_crash.py"


class Started:
    def __init__(self) -> None:
        self.starts = self.stops = 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[str]:
        self.starts += 1
        try:
            yield f"instance {self.starts}"
        finally:
            self.stops += 1


def test_it_starts_once_for_the_files_that_ask_in_a_row_and_stops_after_them() -> None:
    a, b, c, d = (REPO / f"tests/{n}.py" for n in "abcd")
    uses = ["spark"]
    started = Started()
    shared = Shared(SPARK, started)
    assert shared.running() == shared.running() == "instance 1"
    shared.after(Item(a, uses), Item(a))  # the same file goes on: kept
    shared.after(Item(a, uses), Item(b, uses))  # the next file asks: kept
    assert (started.starts, started.stops) == (1, 0)
    shared.after(Item(b, uses), Item(c))
    assert (started.starts, started.stops) == (1, 1)
    assert shared.running() == "instance 2"  # asked for again later: started again
    shared.after(Item(d, uses), None)  # the worker's last test
    assert (started.starts, started.stops) == (2, 2)
    shared.after(Item(d, uses), None)  # nothing running: nothing to stop
    assert started.stops == 2


def test_a_test_asking_from_an_unlisted_file_fails_collection() -> None:
    listed = next(iter(SPARK.files))
    worker_shared.check_listed([Item(REPO / listed, ["spark"])], REPO)  # type: ignore[list-item]
    elsewhere = Item(Path("/tmp/written-by-a-test/test_x.py"), ["spark"])
    worker_shared.check_listed([elsewhere], REPO)  # type: ignore[list-item]
    with pytest.raises(pytest.UsageError, match=r"tests/store/test_crash\.py \(control_plane\)"):
        worker_shared.check_listed(
            [Item(REPO / "tests/store/test_crash.py", ["control_plane"])],  # type: ignore[list-item]
            REPO,
        )
