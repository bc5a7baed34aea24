"""Fixtures of tests/kube: the Kubernetes API server emulator and a real control plane."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kube.api_server import RunningApiServer, serve_in_thread
from tests.kube.control_plane import ControlPlane


@pytest.fixture
def api_server() -> Iterator[RunningApiServer]:
    with serve_in_thread() as server:
        yield server


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One real control plane for every test that needs it (tests/kube/control_plane.py)."""
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    try:
        yield plane.start()
    finally:
        plane.stop()
