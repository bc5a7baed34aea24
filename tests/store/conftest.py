"""Fixtures for store tests: small segments so rollover, retention and recovery are cheap."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from capstan.broker.store.message import Message
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.properties import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY
from capstan.broker.store.topic_config import TopicConfig
from capstan.common.store_settings import IndexSettings, StoreSettings

SEGMENT_BYTES = 64 * 1024
TOPIC = "Orders"


def small_settings(**overrides: object) -> StoreSettings:
    values: dict[str, object] = {
        "commitlog_segment_bytes": SEGMENT_BYTES,
        "consume_queue_units_per_segment": 64,
        "index": IndexSettings(hash_slots_per_file=64, index_entries_per_file=512),
        "checkpoint_interval_ms": 50,
        "clean_interval_ms": 3_600_000,
    }
    values.update(overrides)
    return StoreSettings(**values)  # type: ignore[arg-type]


def make_message(
    i: int, queue_id: int = 0, size: int = 1000, topic: str = TOPIC, tag: str = "a"
) -> Message:
    body = f"message-{i:08d}-".encode() + bytes([i % 251]) * (size - 17)
    return Message(
        topic,
        queue_id,
        body,
        {PROPERTY_KEYS: f"key-{i}", PROPERTY_UNIQ_KEY: f"ID{i:020d}", PROPERTY_TAGS: tag},
    )


def open_store(root: pathlib.Path, queues: int = 4, **overrides: object) -> MessageStore:
    store = MessageStore(root, small_settings(**overrides))
    if store.topics.get(TOPIC) is None:
        store.topics.put(TopicConfig(TOPIC, queues, queues))
    return store


def put_singly(store: MessageStore, messages: list[Message]) -> bool:
    """Put each message on its own, so each is a record of its own (a put of several for
    one queue stores them as one batch record)."""
    return all(store.put([m]).status.ok for m in messages)


@pytest.fixture
def store(tmp_path: pathlib.Path) -> Iterator[MessageStore]:
    s = open_store(tmp_path / "store")
    yield s
    s.close()


CRASH_CHILD = """
import json, os, sys
sys.path.insert(0, {tests!r})
from store.conftest import open_store, make_message
store = open_store({root!r}, queues={queues})
acked = []
for i in range({start}, {start} + {count}):
    result = store.put([make_message(i, queue_id=i % {queues})])
    assert result.status.ok, result
    a = result.appended[0]
    acked.append([i, i % {queues}, a.queue_offset, a.phys_offset, a.size])
print(json.dumps(acked), flush=True)
os._exit(0)  # no close: the abort file stays, as after kill -9
"""


def write_then_crash(
    root: pathlib.Path, count: int, start: int = 0, queues: int = 4
) -> list[tuple[int, int, int, int, int]]:
    """Append `count` messages in a child process that then dies without closing the store.
    Returns (i, queue_id, queue_offset, phys_offset, size) per acknowledged message."""
    import json
    import subprocess
    import sys

    tests = str(pathlib.Path(__file__).resolve().parents[1])
    code = CRASH_CHILD.format(tests=tests, root=str(root), queues=queues, start=start, count=count)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [tuple(a) for a in json.loads(out.stdout)]  # type: ignore[misc]
