"""Fixtures the SDK's integration tests share: one broker process per module, and a fresh
topic and group per test."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count

import pytest

from tests.broker.broker_process import BrokerProcess

_numbers = count()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("broker")).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def names(broker: BrokerProcess) -> tuple[str, str]:
    """A fresh topic (4 queues) and group per test."""
    n = next(_numbers)
    topic, group = f"T{n}", f"G{n}"
    broker.create_topic(topic, queues=4)
    broker.create_group(group)
    return topic, group
