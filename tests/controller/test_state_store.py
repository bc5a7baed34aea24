"""The contract every controller state store keeps (STYLE.md 8): compare-and-swap writes,
one leader at a time with expiry and resignation, corruption reported rather than guessed
over. Every backend runs every test here."""

from __future__ import annotations

import multiprocessing
import pathlib
from collections.abc import Callable

import pytest

from capstan.controller.state_store import (
    LEASE_FILE,
    STATE_FILE,
    FileStateStore,
    StateConflict,
    StateCorrupt,
    StateStore,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


Factory = Callable[[], StateStore]
"""A new client of one shared store (as a second controller replica would be)."""


@pytest.fixture(params=["file"])
def backend(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> tuple[Factory, FakeClock]:
    clock = FakeClock()
    return (lambda: FileStateStore(tmp_path / "controller", clock=clock)), clock


def test_a_new_store_is_empty_and_a_write_is_read_back_by_every_client(backend):
    open_store, _ = backend
    a, b = open_store(), open_store()
    assert a.read().document == {} and a.read().version == ""
    v1 = a.write({"groups": {"g": {"master": 1}}}, "")
    assert b.read().document == {"groups": {"g": {"master": 1}}}
    assert b.read().version == v1
    v2 = b.write({"groups": {"g": {"master": 2}}}, v1)
    assert v2 != v1
    assert a.read().document["groups"]["g"]["master"] == 2


def test_a_write_from_a_stale_read_conflicts_and_changes_nothing(backend):
    open_store, _ = backend
    a, b = open_store(), open_store()
    base = a.write({"n": 0}, "")
    b.write({"n": 1}, base)
    with pytest.raises(StateConflict, match="version"):
        a.write({"n": 99}, base)
    with pytest.raises(StateConflict):
        a.write({"n": 99}, "")  # "never written" is stale too
    assert a.read().document == {"n": 1}
    assert StateConflict.retriable


def _increment(directory: str, times: int) -> None:
    store = FileStateStore(pathlib.Path(directory))
    for _ in range(times):
        while True:
            current = store.read()
            try:
                store.write({"n": current.document.get("n", 0) + 1}, current.version)
                break
            except StateConflict:
                continue


def test_concurrent_writers_in_separate_processes_lose_no_update(tmp_path):
    """Optimistic concurrency holds across processes: read, add one, write if unchanged."""
    directory = tmp_path / "shared"
    FileStateStore(directory)
    workers = [
        multiprocessing.get_context("spawn").Process(target=_increment, args=(str(directory), 25))
        for _ in range(4)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    assert FileStateStore(directory).read().document == {"n": 100}


def test_one_leader_at_a_time_until_it_lapses_or_resigns(backend):
    open_store, clock = backend
    a, b = open_store(), open_store()
    assert a.leader() is None
    assert a.try_lead("controller-a", 10)
    assert not b.try_lead("controller-b", 10)
    lease = b.leader()
    assert lease is not None and lease.holder == "controller-a"
    clock.now += 8
    assert a.try_lead("controller-a", 10)  # renewed: good for 10 s from now
    clock.now += 8
    assert not b.try_lead("controller-b", 10)
    clock.now += 3  # 11 s after the renewal
    assert a.leader() is None
    assert b.try_lead("controller-b", 10)
    assert not a.try_lead("controller-a", 10)
    a.resign("controller-a")  # not the holder: nothing happens
    assert b.leader().holder == "controller-b"  # type: ignore[union-attr]
    b.resign("controller-b")
    assert a.leader() is None
    assert a.try_lead("controller-a", 10)


def test_a_lease_needs_a_holder_and_a_duration(backend):
    open_store, _ = backend
    store = open_store()
    with pytest.raises(ValueError):
        store.try_lead("", 10)
    with pytest.raises(ValueError):
        store.try_lead("x", 0)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        (STATE_FILE, b'{"version": 3, "docu'),
        (STATE_FILE, b"[1, 2]"),
        (STATE_FILE, b'{"version": "3", "document": {}}'),
        (STATE_FILE, b"\xff\xfe"),
        (LEASE_FILE, b'{"holder": "a", "renewed_at_s": "soon"}'),
    ],
    ids=["torn", "not-an-object", "bad-version", "not-utf8", "bad-lease"],
)
def test_a_damaged_file_is_reported_not_guessed_over(tmp_path, name, content):
    store = FileStateStore(tmp_path)
    store.write({"n": 1}, "")
    (tmp_path / name).write_bytes(content)
    with pytest.raises(StateCorrupt, match=name):
        store.read() if name == STATE_FILE else store.leader()
    if name == STATE_FILE:
        with pytest.raises(StateCorrupt):
            store.write({"n": 2}, "1")
