"""`capstan bench store`: CommitLog append and consume-queue read throughput, 1 KiB messages,
each figure next to the raw limit of this disk measured in the same run.

Prints a table, then one line of JSON with the figures (the last line of output).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from capstan.broker.store.async_append import AsyncAppender
from capstan.broker.store.message import Message
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.properties import PROPERTY_UNIQ_KEY
from capstan.broker.store.topic_config import TopicConfig
from capstan.common.store_settings import FlushMode, StoreSettings

BODY = os.urandom(1024)
TOPIC = "BenchTopic"
QUEUES = 8
WRITERS = 64


@dataclass(frozen=True)
class Sizes:
    async_messages: int
    sync_messages: int
    raw_batches: int
    raw_sync_batches: int


QUICK = Sizes(
    async_messages=200_000, sync_messages=64_000, raw_batches=3_000, raw_sync_batches=1_000
)
FULL = Sizes(
    async_messages=1_000_000, sync_messages=320_000, raw_batches=15_000, raw_sync_batches=5_000
)


def _messages(n: int, start: int = 0) -> list[Message]:
    return [
        Message(TOPIC, i % QUEUES, BODY, {PROPERTY_UNIQ_KEY: f"BENCH{i:024d}"})
        for i in range(start, start + n)
    ]


def _open(root: pathlib.Path, mode: FlushMode) -> MessageStore:
    store = MessageStore(
        root, StoreSettings(flush_mode=mode, commitlog_segment_bytes=256 * 1024 * 1024)
    )
    store.topics.put(TopicConfig(TOPIC, QUEUES, QUEUES))
    return store


def raw_write(root: pathlib.Path, batches: int, sync: bool) -> float:
    """The disk's limit: pre-built 1 KiB records, 64 per write, optionally fdatasync each."""
    block = BODY * 64
    fd = os.open(root / f"raw-{sync}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(batches):
            os.write(fd, block)
            if sync:
                os.fdatasync(fd)
        if not sync:
            os.fdatasync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
    return batches * 64 / elapsed


def async_append(root: pathlib.Path, total: int, batch: int) -> float:
    """ASYNC_FLUSH appends of `batch` messages per put, until dispatched and flushed."""
    with _open(root, FlushMode.ASYNC_FLUSH) as store:
        batches = [_messages(batch, i) for i in range(0, total, batch)]
        start = time.perf_counter()
        for messages in batches:
            result = store.put(messages)
            assert result.status.ok, result
        store.commitlog.sync()
        return total / (time.perf_counter() - start)


def sync_append(root: pathlib.Path, total: int) -> tuple[float, float]:
    """SYNC_FLUSH group commit: 64 asyncio writers, one message per put. (msg/s, per fsync)."""
    with _open(root, FlushMode.SYNC_FLUSH) as store:
        per_writer = total // WRITERS

        async def run() -> float:
            appender = AsyncAppender(store)
            appender.start()

            async def writer(w: int) -> None:
                for m in _messages(per_writer, w * per_writer):
                    result = await appender.put([m])
                    assert result.status.ok, result

            start = time.perf_counter()
            await asyncio.gather(*(writer(w) for w in range(WRITERS)))
            elapsed = time.perf_counter() - start
            await appender.stop()
            return elapsed

        fsyncs_before = store.flusher.fsync_count
        elapsed = asyncio.run(run())
        fsyncs = max(1, store.flusher.fsync_count - fsyncs_before)
        return per_writer * WRITERS / elapsed, per_writer * WRITERS / fsyncs


def cq_read(root: pathlib.Path) -> tuple[float, int]:
    """Read every queue from 0 through the consume queue, 32 messages per get."""
    with _open(root, FlushMode.ASYNC_FLUSH) as store:
        count = 0
        start = time.perf_counter()
        for queue_id in range(QUEUES):
            offset = 0
            while True:
                result = store.get(TOPIC, queue_id, offset, 32)
                if not result.messages:
                    break
                count += len(result.messages)
                offset = result.next_begin_offset
        return count / (time.perf_counter() - start), count


def _timed(label: str, fn: Callable[[], float]) -> float:
    print(f"  running: {label} ...", flush=True)
    return fn()


def main(quick: bool = False, directory: str | None = None) -> dict[str, float]:
    sizes = QUICK if quick else FULL
    root = pathlib.Path(tempfile.mkdtemp(prefix="capstan-bench-", dir=directory))
    try:
        raw = _timed("raw 64-record writes", lambda: raw_write(root, sizes.raw_batches, False))
        raw_sync = _timed(
            "raw 64-record writes + fdatasync",
            lambda: raw_write(root, sizes.raw_sync_batches, True),
        )
        a1 = _timed(
            "ASYNC_FLUSH, batch 1", lambda: async_append(root / "a1", sizes.async_messages // 4, 1)
        )
        a64 = _timed(
            "ASYNC_FLUSH, batch 64", lambda: async_append(root / "a64", sizes.async_messages, 64)
        )
        print("  running: SYNC_FLUSH, 64 writers ...", flush=True)
        sync_rate, per_fsync = sync_append(root / "sync", sizes.sync_messages)
        print("  running: consume-queue read ...", flush=True)
        read_rate, read_count = cq_read(root / "a64")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures = {
        "async_append_msgs_per_s": round(a64),
        "async_append_batch1_msgs_per_s": round(a1),
        "sync_flush_msgs_per_s": round(sync_rate),
        "sync_flush_msgs_per_fsync": round(per_fsync, 1),
        "cq_read_msgs_per_s": round(read_rate),
        "cq_read_messages": read_count,
        "raw_write_msgs_per_s": round(raw),
        "raw_fdatasync_msgs_per_s": round(raw_sync),
    }
    _print_table(figures)
    print(json.dumps(figures, sort_keys=True))
    return figures


def _print_table(f: dict[str, float]) -> None:
    rows = [
        (
            "ASYNC_FLUSH append, batch 64",
            f["async_append_msgs_per_s"],
            f["raw_write_msgs_per_s"],
            "raw write",
            300_000,
        ),
        (
            "ASYNC_FLUSH append, batch 1",
            f["async_append_batch1_msgs_per_s"],
            f["raw_write_msgs_per_s"],
            "raw write",
            None,
        ),
        (
            "SYNC_FLUSH group commit, 64 writers",
            f["sync_flush_msgs_per_s"],
            f["raw_fdatasync_msgs_per_s"],
            "raw fdatasync",
            100_000,
        ),
        (
            "consume-queue read, 32 per get",
            f["cq_read_msgs_per_s"],
            f["raw_write_msgs_per_s"],
            "raw write",
            400_000,
        ),
    ]
    print(f"\n{'figure (1 KiB messages)':40} {'msg/s':>10} {'ratio':>7}  {'to':14} {'target':>8}")
    for name, value, raw, raw_name, target in rows:
        ratio = value / raw if raw else 0.0
        print(f"{name:40} {value:>10,.0f} {ratio:>7.2f}  {raw_name:14} {target or '':>8}")
    print(f"{'raw: 64 x 1 KiB per write':40} {f['raw_write_msgs_per_s']:>10,.0f}")
    print(f"{'raw: 64 x 1 KiB per write + fdatasync':40} {f['raw_fdatasync_msgs_per_s']:>10,.0f}")
    print(f"(SYNC_FLUSH: {f['sync_flush_msgs_per_fsync']} messages per fsync)\n")
