from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.broker_process import BrokerProcess


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(autouse=True)
def _quiet_client_logs() -> None:
    logging.getLogger("rocketmq").setLevel(logging.WARNING)


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for a module of tests that do not disturb each other."""
    process = BrokerProcess(tmp_path_factory.mktemp("broker")).start()
    try:
        yield process
    finally:
        process.stop()
