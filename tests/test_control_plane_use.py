"""The control plane's turns among pytest's tests (tests/control_plane_use.py): its files in
one scheduling unit, and the plane stopped once the tests that follow do not ask for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import control_plane_use
from tests.control_plane_use import FILES, SCOPE, ControlPlaneFilesTogether, SharedControlPlane

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Item:
    path: Path
    fixturenames: list[str] = field(default_factory=list)


class Plane:
    def __init__(self) -> None:
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


def scope_of(nodeid: str) -> str:
    scheduler = ControlPlaneFilesTogether.__new__(ControlPlaneFilesTogether)
    return scheduler._split_scope(nodeid)


def test_every_file_that_uses_the_plane_is_one_unit_and_the_others_go_by_file() -> None:
    for file in FILES:
        assert (REPO / file).is_file(), file
        assert scope_of(f"{file}::test_x[kubernetes]") == SCOPE
    assert scope_of("tests/store/test_crash.py::test_kill") == "tests/store/test_crash.py"


def running_shared() -> tuple[SharedControlPlane, Plane]:
    shared = SharedControlPlane(SimpleNamespace())  # type: ignore[arg-type]
    plane = Plane()
    shared.plane = plane  # type: ignore[assignment]
    return shared, plane


def test_the_plane_stops_at_a_files_end_unless_the_next_file_asks_for_it() -> None:
    a, b, c = (REPO / f"tests/{n}.py" for n in "abc")
    uses = ["control_plane"]
    shared, plane = running_shared()
    shared.after(Item(a, uses), Item(a))  # the same file goes on: kept
    shared.after(Item(a, uses), Item(b, uses))  # the next file asks: kept
    assert not plane.stopped and shared.plane is plane
    shared.after(Item(b, uses), Item(c))
    assert plane.stopped and shared.plane is None
    shared, plane = running_shared()
    shared.after(Item(a, uses), None)  # the worker's last test
    assert plane.stopped


def test_a_test_asking_for_the_plane_from_an_unlisted_file_fails_collection() -> None:
    listed = next(iter(FILES))
    control_plane_use.check_listed([Item(REPO / listed, ["control_plane"])], REPO)  # type: ignore[list-item]
    with pytest.raises(pytest.UsageError, match=r"tests/store/test_crash\.py"):
        control_plane_use.check_listed(
            [Item(REPO / "tests/store/test_crash.py", ["control_plane"])],  # type: ignore[list-item]
            REPO,
        )
