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
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import cpu_use, worker_shared
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


def pytest_configure(config: pytest.Config) -> None:
    cpu_use.register(config)  # CAPSTAN_TEST_CPU_LOG: each file's CPU (tests/cpu_use.py)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    worker_shared.check_listed(items, Path(__file__).resolve().parents[1])
    for item in items:
        if starts_processes(item):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadfile`, the files sharing a heavy thing in one unit (tests/worker_shared.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    return worker_shared.FilesTogether(config, log)


@pytest.fixture(scope="module", autouse=True)
def machine_wide(request: pytest.FixtureRequest) -> Iterator[None]:
    """Holds the machine-wide lock while a MACHINE_WIDE file runs (first of its fixtures)."""
    path = Path(str(request.node.path)).resolve()
    repo = Path(__file__).resolve().parents[1]
    if not path.is_relative_to(repo) or str(path.relative_to(repo)) not in MACHINE_WIDE:
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


LEFTOVER_GRACE_S = 3.0
"""How long a stopped Capstan process may take to be gone before it counts as left."""

_started_by: dict[int, str] = {}
"""Capstan processes started since the current test file began, each with the test that
started it (a module-scoped cluster's brokers count for the first test that used it)."""
_session_owned: set[int] = set()
"""Started by session-scoped fixtures: theirs until the test process ends."""


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object]) -> Iterator[object]:
    before = set(capstan_children(os.getpid()))
    try:
        return (yield)
    finally:
        if fixturedef.scope == "session":
            _session_owned.update(set(capstan_children(os.getpid())) - before)


def _note_new_processes(nodeid: str) -> None:
    alive = capstan_children(os.getpid())
    for pid in set(_started_by) - set(alive):
        del _started_by[pid]  # stopped: its pid may come back as another process
    for pid in alive:
        if pid not in _session_owned:
            _started_by.setdefault(pid, nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A test file that leaves a Capstan process running (a test failed before its cleanup,
    or the cleanup forgot or failed) fails at the teardown of its last test, naming each
    process and the test that started it; the processes are killed then. Left alive, one
    would keep its ports and a share of the CPU for the rest of the run (seen in CI: a
    controller outliving its test by twenty minutes). The check waits for the file's end
    because a module-scoped cluster's processes, restarted brokers included, are stopped by
    its own teardown then."""
    _note_new_processes(item.nodeid)  # those its setup and call started
    try:
        return (yield)
    finally:
        _note_new_processes(item.nodeid)
        if nextitem is None or nextitem.path != item.path:
            _fail_on_leftovers()
        for shared in _shared.values():
            shared.after(item, nextitem)


def _fail_on_leftovers() -> None:
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while True:
        alive = set(capstan_children(os.getpid()))
        left = {pid: test for pid, test in _started_by.items() if pid in alive}
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    _started_by.clear()
    if not left:
        return
    named = [f"pid {pid} ({_command_line(pid)}), started by {test}" for pid, test in left.items()]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    pytest.fail(
        "Capstan process(es) left running at the end of the file (killed now): " + "; ".join(named),
        pytrace=False,
    )


def _command_line(pid: int) -> str:
    try:
        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    return " ".join(a.decode(errors="replace") for a in argv if a)[:200]


def pytest_sessionfinish() -> None:
    """What session-scoped fixtures left when the test process ends is killed."""
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


_shared: dict[str, worker_shared.Shared] = {}
"""The worker's shared things (tests/worker_shared.py), by fixture, once first asked for."""


def _shared_one(
    kind: worker_shared.Kind, start: Callable[[], contextlib.AbstractContextManager[Any]]
) -> Iterator[worker_shared.Shared]:
    shared = _shared[kind.fixture] = worker_shared.Shared(kind, start)
    try:
        yield shared
    finally:
        shared.stop()
        del _shared[kind.fixture]


@contextlib.contextmanager
def _started_plane(root: Path) -> Iterator[ControlPlane]:
    plane = ControlPlane(root)
    try:
        yield plane.start()
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def shared_control_plane(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[worker_shared.Shared]:
    yield from _shared_one(
        worker_shared.CONTROL_PLANE,
        lambda: _started_plane(tmp_path_factory.mktemp("control-plane")),
    )


@pytest.fixture(scope="module")
def control_plane(shared_control_plane: worker_shared.Shared) -> ControlPlane:
    """A real control plane (tests/kube/control_plane.py), shared by the files that follow
    one another on this worker."""
    plane = shared_control_plane.running()
    assert isinstance(plane, ControlPlane)
    return plane


@pytest.fixture(scope="session")
def shared_spark() -> Iterator[worker_shared.Shared]:
    from tests.spark.local_session import local_spark  # PySpark only where a test asks

    yield from _shared_one(worker_shared.SPARK, local_spark)


@pytest.fixture(scope="module")
def spark(shared_spark: worker_shared.Shared) -> Any:
    """A local Spark session (tests/spark/local_session.py), shared by the files that follow
    one another on this worker."""
    return shared_spark.running()
