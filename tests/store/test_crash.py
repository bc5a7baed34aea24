"""kill -9 a writer at random moments; after each restart every acknowledged record must be
present and valid, nothing invalid may follow the tail, and queues must agree with the log."""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from capstan.broker.store import format as fmt
from capstan.broker.store import record as rec
from capstan.broker.store.message_store import MessageStore

from .conftest import make_message, open_store

KILLS = 25
WRITER = pathlib.Path(__file__).with_name("crash_writer.py")


def run_and_kill(root: pathlib.Path, first_id: int, seed: int, rng: random.Random) -> list[list]:
    """Start the writer, let it append for a random while, kill -9 it, return its acks."""
    child = subprocess.Popen(
        [sys.executable, str(WRITER), str(root), str(first_id), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert child.stdout is not None
    lines: list[str] = []
    ready = threading.Event()

    def reader() -> None:
        for line in child.stdout:  # type: ignore[union-attr]
            if line.startswith("READY"):
                ready.set()
            elif line.endswith("\n"):
                lines.append(line)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    assert ready.wait(60), "the writer did not start"
    time.sleep(rng.uniform(0.05, 0.6))
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    thread.join(30)
    child.stdout.close()
    if child.stderr is not None:
        child.stderr.close()
    acks = [json.loads(line) for line in lines]
    assert all(a[0] != "FAILED" for a in acks), acks
    return acks


def check_log_tail(store: MessageStore) -> None:
    """Every byte from the log's start to its end is a valid record; nothing follows."""
    offset = store.commitlog.min_offset
    end = store.commitlog.write_offset
    segment_bytes = store.commitlog.segment_bytes
    while offset < end:
        segment = store.commitlog.files.find(offset)
        assert segment is not None
        data = segment.read(offset - segment.start, segment_bytes)
        pos = offset - segment.start
        i = 0
        while segment.start + pos + i < end:
            size, problem, is_blank = rec.check_at(data, i, segment.start + pos + i)
            assert problem is None, f"invalid record at {segment.start + pos + i}: {problem}"
            i += size
            if is_blank:
                break
        offset = segment.start + pos + i
    last = store.commitlog.files.last
    assert last is not None
    if end == last.start + segment_bytes:
        # Killed after the blank that ends a segment, before the next segment got a byte:
        # the log ends at the segment boundary and the blank must be the file's last bytes.
        tail = last.read(last.length() - fmt.BLANK_RECORD_BYTES, fmt.BLANK_RECORD_BYTES)
        size, magic = fmt.BLANK_RECORD.unpack(tail)
        assert (
            magic == fmt.BLANK_MAGIC
            and last.length() - fmt.BLANK_RECORD_BYTES + size == segment_bytes
        )
    else:
        assert last.start + last.length() == end, "bytes follow the tail"


def check_queues_agree_with_log(store: MessageStore) -> int:
    """Every unit of every queue points at the record holding that very queue offset."""
    units = 0
    for queue in store.queues:
        offset = queue.min_offset
        while offset < queue.max_offset:
            batch = queue.read(offset, 1000)
            assert batch, f"{queue.topic}/{queue.queue_id}: no unit at {offset}"
            for unit in batch:
                msg = store.read_message(unit.phys_offset)
                assert msg is not None and unit.size == msg.size
                assert (msg.topic, msg.queue_id, msg.queue_offset) == (
                    queue.topic,
                    queue.queue_id,
                    offset,
                )
                offset += 1
                units += 1
    return units


@pytest.mark.slow
@pytest.mark.chaos
def test_kill_9_never_loses_an_acknowledged_record(tmp_path: pathlib.Path) -> None:
    rng = random.Random(20261121)
    root = tmp_path / "store"
    acked: dict[int, list] = {}
    next_id = 0
    for round_no in range(KILLS):
        acks = run_and_kill(root, next_id, rng.randrange(2**32), rng)
        for ack in acks:
            acked[ack[0]] = ack
        next_id += 100_000
        with open_store(root, queues=3) as store:
            assert store.recovery.crashed, f"round {round_no}: crash not detected"
            assert store.recovery.damaged_ranges == []
            check_log_tail(store)
            for msg_id, topic, queue_id, queue_offset, phys, size in acked.values():
                got = store.get(topic, queue_id, queue_offset, 1)
                assert got.messages, f"round {round_no}: acked message {msg_id} lost"
                [msg] = got.messages
                assert msg.phys_offset == phys
                assert msg.body == make_message(msg_id, size=size).body
            assert check_queues_agree_with_log(store) >= len(acked)
    assert len(acked) > 500, "the writer acknowledged too little to mean anything"
