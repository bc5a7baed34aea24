"""The `integration` tier, by rule rather than by hand.

A test is `integration` when running it starts Capstan in a process of its own that the test
talks to over 127.0.0.1: a broker, a controller, `capstan up`, the CLI against a server, an SDK
consumer. The helpers of tests/ that start such processes declare themselves with
`tests.tiers.process_tool` (BrokerProcess, ControllerProcess, UpProcess, the `capstan` CLI
runner, ...). At collection a test is marked when its own function, or any fixture in its
closure, reaches a process tool: by naming it, or through functions and classes of tests/
that name one, followed transitively. A fixture such as `broker` or `cluster` therefore marks
every test that uses it, directly or through another fixture (`names` needs `broker`).

Child processes that touch no socket stay in the fast tier: the store's crash writers (a
child appends, then dies without closing), processes racing on a state file, and
`capstan store ...` or a bad `capstan controller --config` that ends before opening a port.

`slow` and `chaos` remain judgments made by hand in each module.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import inspect
import os
import signal
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube.control_plane import ControlPlane
from tests.tiers import is_process_tool

_OURS = "tests"


def _ours(thing: object) -> bool:
    module = getattr(thing, "__module__", None) or ""
    return module == _OURS or module.startswith(_OURS + ".")


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    """A function's code and the code of the lambdas and functions nested in it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _named_by(function: types.FunctionType) -> Iterator[object]:
    """The module-level objects a function's code may refer to (over-approximated: an
    attribute name that is also a global of the module counts)."""
    for code in _code_objects(function.__code__):
        for name in code.co_names:
            if name in function.__globals__:
                yield function.__globals__[name]


def _members(thing: object) -> Iterator[object]:
    if isinstance(thing, types.FunctionType):
        yield from _named_by(thing)
    elif inspect.isclass(thing):
        for value in vars(thing).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            elif isinstance(value, property):
                value = value.fget
            if isinstance(value, types.FunctionType):
                yield value


def reaches_process_tool(start: object) -> bool:
    """Whether `start`, or a function or class of tests/ it leads to, is a process tool."""
    start = inspect.unwrap(start) if callable(start) else start
    seen: set[int] = set()
    todo = [start]
    while todo:
        thing = todo.pop()
        if id(thing) in seen:
            continue
        seen.add(id(thing))
        if is_process_tool(thing):
            return True
        if thing is start or _ours(thing):
            todo.extend(_members(thing))
    return False


def starts_processes(item: pytest.Item) -> bool:
    if not isinstance(item, pytest.Function):
        return False
    if reaches_process_tool(item.function):
        return True
    fixtures = item._fixtureinfo.name2fixturedefs
    return any(
        reaches_process_tool(definition.func)
        for name in item.fixturenames
        for definition in fixtures.get(name, ())
    )


MACHINE_WIDE = frozenset(
    {
        "tests/kube/test_node.py",
    }
)
"""Files whose tests change the machine itself (the real node's bridges, rules, cgroups and
mounts): never two at once, whichever pytest-xdist worker runs them (scripts/test.sh runs
whole files per worker)."""
MACHINE_LOCK = Path("/tmp/capstan-tests-machine-wide.lock")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if starts_processes(item):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module", autouse=True)
def machine_wide(request: pytest.FixtureRequest) -> Iterator[None]:
    """Holds the machine-wide lock while a MACHINE_WIDE file runs (first of its fixtures)."""
    path = Path(str(request.node.path)).resolve().relative_to(Path(__file__).resolve().parents[1])
    if str(path) not in MACHINE_WIDE:
        yield
        return
    with MACHINE_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def main_thread_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One idle event loop, kept for the whole run and closed at its end."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(autouse=True)
def a_current_event_loop(
    request: pytest.FixtureRequest, main_thread_loop: asyncio.AbstractEventLoop
) -> Iterator[None]:
    """The official RocketMQ client makes grpc.aio calls (its Telemetry stream) from the
    thread that calls it, and grpc.aio needs that thread's current event loop; a test that
    ran asyncio.run earlier in the same worker leaves the main thread with none ("There is
    no current event loop in thread 'MainThread'", the client then fails to route). Give it
    one again, as a fresh process has."""
    if inspect.iscoroutinefunction(getattr(request, "function", None)):
        yield  # pytest-asyncio runs it on a loop of its own
        return
    policy = asyncio.get_event_loop_policy()
    policy.set_event_loop(main_thread_loop)
    yield
    policy.set_event_loop(None)


@pytest.fixture(scope="session", autouse=True)
def no_capstan_process_left() -> Iterator[None]:
    """When a test process ends, a Capstan process it started and never stopped (its test
    failed before the cleanup, or the cleanup itself failed) is killed: it would otherwise
    keep its ports and a share of the CPU for the rest of the run (seen in CI: a controller
    outliving its test by twenty minutes)."""
    yield
    for pid in capstan_children(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def capstan_children(parent: int) -> list[int]:
    """The pids of `parent`'s children that run the capstan command line."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and (
            b"capstan.cli" in argv or any(a.endswith(b"/capstan") for a in argv)
        ):
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One real control plane for every test that needs it (tests/kube/control_plane.py)."""
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    try:
        yield plane.start()
    finally:
        plane.stop()
