"""What a pytest worker starts once and shares among the files that follow one another: the
real control plane (tests/kube/control_plane.py) and a local Spark session
(tests/spark/local_session.py).

Each costs a worker that keeps it: an idle control plane about 3 % of a core (its API
server, etcd and controller manager, 1.9 CPU-seconds a minute) and 3-4 CPU-seconds to start;
a Spark session a JVM, most of a short job's time to start. Kept for the whole session, or
started again by every file, as they were, that came to minutes of CPU. So:

- The control plane's files are scheduled as one unit (`FilesTogether`, pytest-xdist's
  `loadfile` with those files in one scope), so one worker starts it once for all of them;
  Spark's go file by file, and a worker that runs two in a row starts one JVM for both.
- It starts when a test first asks for it and stops after the last test of a file when the
  next test does not ask for it (`Shared.after`); a later test that does starts it again.

`KINDS` names the files; collection fails when a test asks for one from a file its kind
does not name, so the lists cannot fall behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling


@dataclass(frozen=True)
class Kind:
    fixture: str
    """The fixture that hands it to a test."""
    files: frozenset[str]
    """Every file with a test that asks for it, from the repo's root."""
    together: bool = True
    """Its files scheduled as one unit on one worker."""

    @property
    def scope(self) -> str:
        return f"the files sharing {self.fixture}"


CONTROL_PLANE = Kind(
    "control_plane",
    frozenset(
        {
            "tests/charts/test_monitoring_with_prometheus.py",
            "tests/controller/test_state_store.py",
            "tests/kube/test_control_plane.py",
            "tests/operator/test_cert_manager_on_the_api_server.py",
            "tests/operator/test_crds_on_api_server.py",
            "tests/operator/test_manifests_on_api_server.py",
            "tests/operator/test_operator_on_the_api_server.py",
            "tests/operator/test_status_writer.py",
            "tests/test_tiers.py",
        }
    ),
)
SPARK = Kind(
    "spark",
    frozenset(
        {
            "tests/broker/replication/test_faults.py",
            "tests/spark/test_capstan_source.py",
            "tests/spark/test_compaction_job.py",
            "tests/spark/test_offset_audit.py",
            "tests/spark/test_static_topic_jobs.py",
        }
    ),
    # Not one unit: at half the CPU the Spark files and the replication faults on one worker,
    # beside the control plane's files on the other, made pytest's tail minutes longer.
    together=False,
)
KINDS = (CONTROL_PLANE, SPARK)


class FilesTogether(LoadFileScheduling):
    """Whole files per worker, as `--dist loadfile`, but each kind's files in one unit."""

    def _split_scope(self, nodeid: str) -> str:
        file = nodeid.split("::", 1)[0]
        for kind in KINDS:
            if kind.together and file in kind.files:
                return kind.scope
        return super()._split_scope(nodeid)


def check_listed(items: list[pytest.Item], repo: Path) -> None:
    """Fail collection when a test asks for a shared thing from a file its kind does not
    name."""
    unlisted: set[str] = set()
    for item in items:
        path = Path(item.path).resolve()
        if not path.is_relative_to(repo):
            continue  # a file a test wrote and ran pytest on
        file = str(path.relative_to(repo))
        for kind in KINDS:
            if kind.fixture in getattr(item, "fixturenames", ()) and file not in kind.files:
                unlisted.add(f"{file} ({kind.fixture})")
    if unlisted:
        raise pytest.UsageError(
            f"{', '.join(sorted(unlisted))}: add them to tests/worker_shared.py KINDS"
        )


class Shared:
    """One kind's running instance on this worker, started on first use, stopped once
    unused. `start` is a context manager: entered to start, left to stop."""

    def __init__(self, kind: Kind, start: Callable[[], contextlib.AbstractContextManager[Any]]):
        self.kind, self.start = kind, start
        self.value: Any = None
        self._exit = contextlib.ExitStack()

    def running(self) -> Any:
        if self.value is None:
            self.value = self._exit.enter_context(self.start())
        return self.value

    def stop(self) -> None:
        if self.value is not None:
            self.value = None
            self._exit.close()

    def after(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        """At a test's teardown: stop at a file's end if what follows does not ask for it (a
        test that asks later, as one taking it through getfixturevalue does, starts it
        again)."""
        if self.value is None or (nextitem is not None and nextitem.path == item.path):
            return
        if nextitem is None or self.kind.fixture not in getattr(nextitem, "fixturenames", ()):
            self.stop()
