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
