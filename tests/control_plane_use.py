"""How pytest's workers share the real control plane (tests/kube/control_plane.py).

An idle control plane still costs about 3 % of a core (its API server, etcd and controller
manager, measured: 1.9 CPU-seconds a minute) and 3-4 CPU-seconds to start. Kept for the
whole session, as it was, each worker that ever used one paid that for the rest of the run.
So:

- The files that use it are scheduled as one unit (`ControlPlaneFilesTogether`, pytest-xdist's
  `loadfile` with those files in one scope), so one worker starts one plane for all of them.
- The plane starts when a test first asks for it and stops after the last test of a file
  when the next test does not ask for it (`SharedControlPlane`); a later test that does
  starts a new one.

`FILES` names the files; collection fails when a test asks for `control_plane` from a file
it does not name, so the list cannot fall behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from xdist.scheduler import LoadFileScheduling

from tests.kube.control_plane import ControlPlane

FILES = frozenset(
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
)
SCOPE = "the control plane's files"


class ControlPlaneFilesTogether(LoadFileScheduling):
    """Whole files per worker, as `--dist loadfile`, but every file of `FILES` in one unit."""

    def _split_scope(self, nodeid: str) -> str:
        file = nodeid.split("::", 1)[0]
        return SCOPE if file in FILES else super()._split_scope(nodeid)


def check_listed(items: list[pytest.Item], repo: Path) -> None:
    """Fail collection when a test asks for the plane from a file `FILES` does not name."""
    unlisted = sorted(
        {
            str(Path(item.path).resolve().relative_to(repo))
            for item in items
            if "control_plane" in getattr(item, "fixturenames", ())
            and str(Path(item.path).resolve().relative_to(repo)) not in FILES
        }
    )
    if unlisted:
        raise pytest.UsageError(
            f"{', '.join(unlisted)} use the control plane: add them to "
            "tests/control_plane_use.py FILES"
        )


class SharedControlPlane:
    """The worker's one control plane, started on first use, stopped once unused."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.plane: ControlPlane | None = None
        self.starts = 0

    def running(self) -> ControlPlane:
        if self.plane is None:
            self.plane = ControlPlane(self.factory.mktemp("control-plane")).start()
            self.starts += 1
        return self.plane

    def stop(self) -> None:
        if self.plane is not None:
            plane, self.plane = self.plane, None
            plane.stop()

    def after(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        """At a test's teardown: stop the plane at a file's end if what follows does not
        ask for it (a test that asks later, as one taking it through getfixturevalue does,
        starts another)."""
        if self.plane is None or (nextitem is not None and nextitem.path == item.path):
            return
        if nextitem is None or "control_plane" not in getattr(nextitem, "fixturenames", ()):
            self.stop()
