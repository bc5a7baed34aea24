"""Compaction of a compact topic by the PySpark job (real PySpark local mode, a real broker):
a reader from the start sees the latest value of each live key, at its own offset, while
records produced during the job are all there; expired tombstones take their key along; the
CommitLog shrinks; a restart keeps it; a driver killed with -9 anywhere changes nothing."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.spark.compaction import compact
from capstan.v1 import admin_pb2 as apb
from capstan.v1 import pull_pb2 as ppb
from capstan.v1 import pull_pb2_grpc as ppb_grpc
from tests.broker.broker_process import BrokerProcess, open_channel
from tests.broker.v2_requests import send_to_queue, stub, v2_message
from tests.waiting import finish_progressing, wait_until

# Spark drivers start as processes of their own here (a JVM each: 18 s alone on the 2-core
# machine); in CI, beside the e2e story's cold image builds, one of these took over 300 s,
# the default per-test bound, hence 900 s.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

TABLE = "Prices"
QUEUES = 2
SEGMENT = 256 * 1024


def compact_broker(tmp_path: Path) -> BrokerProcess:
    broker = BrokerProcess(
        tmp_path,
        # The disk watermark off: a development machine's disk fuller than the default 75 %
        # had retention delete the topic's segments under the test (the watermark has its
        # own tests, tests/store/test_retention.py).
        store={
            "commitlog_segment_bytes": SEGMENT,
            "flush_mode": "SYNC_FLUSH",
            "disk_max_used_ratio": 1.0,
        },
    ).start()
    broker.admin().CreateTopic(
        apb.Topic(
            name=TABLE,
            type=apb.NORMAL,
            read_queue_nums=QUEUES,
            write_queue_nums=QUEUES,
            attributes={"cleanup.policy": "COMPACT"},
        ),
        timeout=10,
    )
    return broker


@functools.lru_cache(maxsize=8)
def _sender(address: str) -> svc_grpc.MessagingServiceStub:
    """One channel per broker for every send (thousands of channels, each its own
    connection, made a test's writes minutes long on a loaded machine)."""
    return stub(address)


def _record(key: str, value: str, tombstone: bool = False) -> pb.Message:
    m = v2_message(TABLE, value.encode() + b"." * 700, keys=[key])
    if tombstone:
        m.user_properties["tombstone"] = "true"
    return m


def _queue_of(key: str) -> int:
    """A key always goes to the same queue."""
    return int(key[1:]) % QUEUES


def put(address: str, key: str, value: str, tombstone: bool = False) -> None:
    """Send `value` for `key`, to the key's queue."""
    reply, _ = send_to_queue(_sender(address), str(_queue_of(key)), _record(key, value, tombstone))
    assert reply.status.code == pb.OK, reply


def put_many(address: str, values: list[tuple[str, str]], batch: int = 100) -> None:
    """Send (key, value) pairs as `put` does, in order, up to `batch` a request per queue
    (each record its own: a batch of the v2 protocol is stored message by message). A
    test filling the topic this way pays one SYNC_FLUSH a request, not one a record."""
    by_queue: dict[int, list[pb.Message]] = {}
    for key, value in values:
        by_queue.setdefault(_queue_of(key), []).append(_record(key, value))
    for queue, messages in by_queue.items():
        for start in range(0, len(messages), batch):
            chunk = messages[start : start + batch]
            reply, _ = send_to_queue(_sender(address), str(queue), *chunk)
            assert reply.status.code == pb.OK, reply.status
            assert len(reply.entries) == len(chunk), reply


def read_from_start(address: str) -> list[tuple[int, int, str, str, bool]]:
    """(queue, offset, key, value, tombstone) of every record a reader from the start gets."""
    found = []
    pull = ppb_grpc.PullStub(open_channel(address))
    for queue in range(QUEUES):
        offset = 0
        while True:
            reply = pull.PullMessages(
                ppb.PullMessagesRequest(
                    topic=TABLE, queue_id=queue, offset=offset, max_messages=64
                ),
                timeout=10,
            )
            for m in reply.messages:
                value = m.body.rstrip(b".").decode()
                tombstone = m.properties.get("tombstone") == "true"
                found.append((queue, m.queue_offset, m.properties["KEYS"], value, tombstone))
            if reply.next_begin_offset <= offset or reply.status == ppb.NO_NEW_MSG:
                break
            offset = reply.next_begin_offset
    return found


def latest(records: list[tuple[int, int, str, str, bool]]) -> dict[str, tuple[str, bool]]:
    values: dict[str, tuple[str, bool]] = {}
    for _, _, key, value, tombstone in sorted(records, key=lambda r: (r[0], r[1])):
        values[key] = (value, tombstone)
    return values


def store_bytes(broker: BrokerProcess) -> int:
    data = broker.root / "data" / "store"
    return sum(
        p.stat().st_size
        for d in ("commitlog", "compacted")
        for p in (data / d).rglob("*")
        if p.is_file()
    )


def test_compaction_keeps_the_latest_value_per_live_key(spark: SparkSession, tmp_path: Path):
    broker = compact_broker(tmp_path)
    try:
        put_many(
            broker.address, [(f"k{k}", f"v{round_}") for round_ in range(100) for k in range(40)]
        )
        for k in range(0, 40, 10):
            put(broker.address, f"k{k}", "", tombstone=True)  # k0 k10 k20 k30 deleted
        before = read_from_start(broker.address)
        assert len(before) == 100 * 40 + 4
        bytes_before = store_bytes(broker)

        produced: list[tuple[str, str]] = []
        stop = threading.Event()

        def produce() -> None:
            n = 0
            while not stop.is_set() and n < 300:  # bounded, so the disk figures mean something
                key = f"k{n % 7 + 1}"  # never a key the tombstones delete
                put(broker.address, key, f"during-{n}")
                produced.append((key, f"during-{n}"))
                n += 1
                stop.wait(0.02)

        producer = threading.Thread(target=produce)
        producer.start()
        try:
            result = compact(spark, TABLE, brokers=(broker.address,), tombstone_retention_ms=0)
        finally:
            stop.set()
            producer.join()
        assert result.ok, result
        [group] = result.groups
        assert group.records_read >= 100 * 40 + 4 and group.tombstones_dropped == 4
        [replica] = group.replicas
        assert replica.generation == 1 and replica.commitlog_bytes_freed > 0

        after = read_from_start(broker.address)
        cuts = group.cuts
        below = [r for r in after if r[1] < cuts[r[0]]]
        # Below the cut: one record per live key, none a tombstone.
        assert sorted(r[2] for r in below) == sorted(f"k{k}" for k in range(40) if k % 10)
        assert not any(tomb for *_, tomb in below) and replica.kept == len(below)
        # Produced during the job: each is there, or superseded below the cut by a later
        # value of its key; per key in the order sent.
        pairs = {(key, value) for _, _, key, value, _ in after}
        for i, (key, value) in enumerate(produced):
            if (key, value) not in pairs:
                assert any(k == key for k, _ in produced[i + 1 :]), f"{key}={value} was lost"
        for queue in range(QUEUES):
            offsets = [offset for q, offset, *_ in after if q == queue]
            assert offsets == sorted(offsets)
        sent_order = {pair: n for n, pair in enumerate(produced)}
        for key in {k for k, _ in produced}:
            seen = [
                sent_order[(k, v)] for _, _, k, v, _ in after if (k, v) in sent_order and k == key
            ]
            assert seen == sorted(seen)
        expected = {k: v for k, v in latest(before).items() if not v[1]}
        expected.update({key: (value, False) for key, value in produced})
        assert latest(after) == expected

        bytes_after = store_bytes(broker)
        print(f"store bytes before {bytes_before}, after {bytes_after} ({len(produced)} sent)")
        assert bytes_after < bytes_before / 2

        assert broker.stop() == 0
        broker.start()
        assert read_from_start(broker.address) == after
    finally:
        broker.stop()


def run_job(broker: BrokerProcess, hold: str | None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONSAFEPATH": "1", "PYSPARK_PYTHON": sys.executable}
    env["TMPDIR"] = str(broker.root)  # where Spark's own output goes, not /tmp
    if hold:
        env["CAPSTAN_SPARK_HOLD_AT"] = hold
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "capstan.cli",
            "spark",
            "compact",
            TABLE,
            "--server",
            broker.address,
            "--master",
            "local[1]",
            "--tombstone-retention-ms",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # the driver and its JVM, killed together
    )


def test_a_driver_killed_anywhere_leaves_the_topic_as_it_was(tmp_path: Path):
    broker = compact_broker(tmp_path)
    try:
        put_many(  # two batches of the manifest's upload
            broker.address,
            [
                (f"k{k}", f"v{round_}")
                for round_ in range(3)
                for k in range(3000)
                if round_ < 2 or k % 2
            ],
        )
        before = read_from_start(broker.address)
        compacted = broker.root / "data" / "store" / "compacted"
        for hold in ("read", "manifest", "upload"):
            job = run_job(broker, hold)
            lines = []
            assert job.stderr is not None
            for line in job.stderr:
                lines.append(line)
                if f"holding at {hold}" in line:
                    break
            else:
                raise AssertionError(f"the job ended before {hold}: {''.join(lines)[-3000:]}")
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate(timeout=30)  # reaps it and closes its pipes
            after = read_from_start(broker.address)
            if after != before:  # say who changed it: the broker's compaction lines, the job's
                log = broker.log.read_text()
                calls = [line for line in log.splitlines() if "compaction" in line]
                raise AssertionError(
                    f"killed at {hold}: {len(before)} records before, {len(after)} after;"
                    f" broker: {calls[-10:]}; job: {''.join(lines)[-2000:]}"
                )
            # A stream cut off mid-upload is abandoned: no generation is left behind.
            wait_until(lambda: not any(compacted.rglob("gen-*")), 30, f"no generation after {hold}")
        job = run_job(broker, None)
        done = finish_progressing(job)
        out, err = done.stdout, done.stderr
        assert done.returncode == 0, err[-3000:]
        assert "kept" in out
        after = read_from_start(broker.address)
        assert len(after) == 3000
        assert latest(after) == latest(before)
    finally:
        broker.stop()
