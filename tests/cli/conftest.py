"""A standalone broker and a controller (with no broker group), started once per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.broker.broker_process import BrokerProcess
from tests.controller.controller_process import ControllerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("broker")).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    root = tmp_path_factory.mktemp("controller")
    process = ControllerProcess(root, root / "state").start()
    try:
        yield process
    finally:
        process.stop()
