"""Fixtures for the tests of the Kubernetes API server emulator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kube.api_server import RunningApiServer, serve_in_thread


@pytest.fixture
def api_server() -> Iterator[RunningApiServer]:
    with serve_in_thread() as server:
        yield server
