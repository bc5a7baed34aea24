"""Bad input and faults: each gets a clear status or error, and the store stays usable."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from capstan.broker.store.admission import AdmittedBatch
from capstan.broker.store.message import Message
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.status import PutStatus
from capstan.broker.store.topic_config import PERM_READ, TopicConfig
from capstan.common.errors import StoreLockedError

from .conftest import SEGMENT_BYTES, TOPIC, make_message, open_store

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("message", "status"),
    [
        (Message(TOPIC, 0, b""), PutStatus.MESSAGE_BODY_EMPTY),
        (Message(TOPIC, 0, b"x" * (4 * 1024 * 1024 + 1)), PutStatus.MESSAGE_BODY_TOO_LARGE),
        (Message(TOPIC, 0, b"x" * (SEGMENT_BYTES - 100)), PutStatus.MESSAGE_ILLEGAL),
        (Message(TOPIC, 0, b"x", {"p": "v" * 40_000}), PutStatus.PROPERTIES_SIZE_EXCEEDED),
        (Message("Unknown", 0, b"x"), PutStatus.TOPIC_NOT_EXIST),
        (Message(TOPIC, 4, b"x"), PutStatus.QUEUE_NOT_EXIST),
        (Message(TOPIC, -1, b"x"), PutStatus.QUEUE_NOT_EXIST),
    ],
    ids=["empty", "over-4MiB", "over-segment", "properties", "topic", "queue", "negative-queue"],
)
def test_bad_message_is_refused_and_changes_nothing(
    store: MessageStore, message: Message, status: PutStatus
) -> None:
    store.put([make_message(0)])
    end = store.commitlog.write_offset
    result = store.put([make_message(1), message])
    assert result.status is status and result.detail
    assert result.appended == []
    assert store.commitlog.write_offset == end
    assert store.queue_bounds(TOPIC, 0) == (0, 1)
    assert store.put([make_message(2)]).appended[0].queue_offset == 1


def test_read_only_topic_refuses_writes(store: MessageStore) -> None:
    store.topics.put(TopicConfig("ReadOnly", 2, 2, perm=PERM_READ))
    assert store.put([Message("ReadOnly", 0, b"x")]).status is PutStatus.NOT_WRITEABLE


def test_closed_store_refuses_writes(tmp_path: pathlib.Path) -> None:
    s = open_store(tmp_path)
    s.close()
    assert s.append(AdmittedBatch([])).status is PutStatus.SERVICE_NOT_AVAILABLE


def test_second_process_cannot_open_the_same_store(store: MessageStore) -> None:
    code = f"""
from capstan.broker.store.message_store import MessageStore
from capstan.common.errors import StoreLockedError
try:
    MessageStore({str(store.root)!r})
except StoreLockedError as exc:
    print("LOCKED", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("LOCKED"), out.stderr
    assert f"pid {os.getpid()}" in out.stdout
    with pytest.raises(StoreLockedError):
        MessageStore(store.root)
    assert store.put([make_message(1)]).status.ok


DISK_FULL_CHILD = textwrap.dedent(
    """
    import json, resource, sys
    sys.path.insert(0, {tests!r})
    from store.conftest import open_store, make_message, TOPIC
    root = {root!r}
    limit = 40 * 1024  # below the 64 KiB segment size: the limit is per file
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    store = open_store(root, index_enabled=False)
    acked, statuses = [], []
    for i in range(400):
        result = store.put([make_message(i, size=3000)])
        statuses.append(result.status.name)
        if result.status.ok:
            acked.append(i)
        elif result.status.name == "DISK_FULL":
            break
    refused_again = store.put([make_message(9999, size=3000)]).status.name
    readable = [m.body == make_message(i, size=3000).body
                for i, m in zip(acked, store.get(TOPIC, 0, 0, max_messages=1000).messages)]
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    resumed = store.put([make_message(500, size=3000)])
    store.close()
    print(json.dumps(dict(acked=acked, last=statuses[-1], refused_again=refused_again,
                          readable=readable, resumed=resumed.status.name,
                          resumed_offset=resumed.appended[0].queue_offset)))
    """
)


@pytest.mark.chaos
def test_full_disk_refuses_cleanly_and_resumes_when_space_returns(tmp_path: pathlib.Path) -> None:
    """RLIMIT_FSIZE fails every write past 40 KiB of a file with EFBIG, as a full disk would."""
    root = tmp_path / "store"
    code = DISK_FULL_CHILD.format(tests=str(REPO / "tests"), root=str(root))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["last"] == "DISK_FULL" and report["refused_again"] == "DISK_FULL"
    assert len(report["acked"]) > 10 and all(report["readable"])
    assert len(report["readable"]) == len(report["acked"])
    assert report["resumed"] == "PUT_OK" and report["resumed_offset"] == len(report["acked"])
    with open_store(root) as s:
        assert s.recovery.lost_nothing
        got = s.get(TOPIC, 0, 0, max_messages=1000)
        assert [m.queue_offset for m in got.messages] == list(range(len(report["acked"]) + 1))


def test_failed_dispatch_catches_up_from_the_log(
    store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consume-queue write that hits a full disk does not fail the (durable) append; the
    housekeeping routine re-reads the log and the message becomes readable."""
    import errno
    import time

    from capstan.broker.store.consume_queue import ConsumeQueue

    store.put([make_message(0)])
    real_append = ConsumeQueue.append
    failures = []

    def full_disk_once(self: ConsumeQueue, first_offset: int, units: bytes) -> None:
        if not failures:
            failures.append(first_offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        real_append(self, first_offset, units)

    monkeypatch.setattr(ConsumeQueue, "append", full_disk_once)
    result = store.put([make_message(1)])
    assert result.status is PutStatus.PUT_OK and failures == [1]
    assert store.put([make_message(2)]).status is PutStatus.PUT_OK  # queued behind the gap
    deadline = time.monotonic() + 10
    while store.queue_bounds(TOPIC, 0) != (0, 3) and time.monotonic() < deadline:
        time.sleep(0.02)
    got = store.get(TOPIC, 0, 0, 10)
    assert [m.body for m in got.messages] == [make_message(i).body for i in range(3)]
    assert store.dispatched_offset == store.commitlog.write_offset
