"""The offset audit (real PySpark local mode): a clean `capstan up` cluster reports nothing
wrong, with its lag, reports and metrics; each fault it claims to find is injected for real
and reported precisely, and nothing else is: a flipped byte in a slave's segment, a slave
whose tail holds other (valid) records than its master's, retention run under a lagging
group, a committed offset past the end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import yaml
from pyspark.sql import SparkSession
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.broker.store import format as fmt
from capstan.spark.audit import audit
from capstan.v1 import consumer_pb2 as cpb
from capstan.v1 import consumer_pb2_grpc as cpb_grpc
from capstan.v1 import pull_pb2 as ppb
from capstan.v1 import pull_pb2_grpc as ppb_grpc
from tests.broker.broker_process import BrokerProcess, open_channel
from tests.broker.replication.test_controlled_group import metric, start_cluster, stop_cluster
from tests.broker.replication.test_replication_stream import scrape
from tests.broker.v2_requests import send_to_queue, stub, v2_message
from tests.charts.pushgateway import http_get, running_pushgateway
from tests.cli.test_broker_cli import capstan
from tests.cli.up_process import UpProcess
from tests.waiting import run_progressing, wait_until

# Spark drivers start as processes of their own here (a JVM each: 18 s alone on the 2-core
# machine); in CI, beside the e2e story's cold image builds, one of these took over 300 s,
# the default per-test bound, hence 900 s.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_clean_capstan_up_cluster_reports_nothing_wrong(tmp_path: Path):
    up = UpProcess(tmp_path / "up").start()
    try:
        with running_pushgateway() as gateway_address:
            audit_clean_cluster(up, tmp_path, gateway_address)
    finally:
        assert up.stop() == 0


def audit_clean_cluster(up: UpProcess, tmp_path: Path, gateway_address: str) -> None:
    server = ("--server", up.access_point)
    assert capstan("topic", "create", "Orders", "--queues", "4", *server).returncode == 0
    assert capstan("group", "create", "Readers", *server).returncode == 0
    assert capstan("topic", "create", "Unused", *server).returncode == 0  # audited, empty
    sent = capstan("produce", "Orders", "--count", "300", "--body", "o", *server)
    assert sent.returncode == 0, sent.stderr
    got = capstan("consume", "Orders", "--group", "Readers", "--count", "100", *server)
    assert got.returncode == 0, got.stderr
    reports = tmp_path / "reports"
    done = run_progressing(
        [sys.executable, "-m", "capstan.cli", "spark", "audit", "--server",
         up.access_point, "--master", "local[2]", "--report-dir", str(reports), "--json",
         "--pushgateway", gateway_address, "--cluster", "test-up"],
        env={**os.environ, "PYTHONSAFEPATH": "1", "TMPDIR": str(tmp_path)},  # Spark's log
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["ok"] and report["problems"] == []
    assert report["records_checked"] >= 2 * 300  # both replicas read
    lags = [q for q in report["lags"] if q["consumer_group"] == "Readers"]
    assert {q["topic"] for q in lags} >= {"Orders"}
    orders = [q for q in lags if q["topic"] == "Orders"]
    assert sum(q["lag"] for q in orders) == 200
    assert all(q["lag_age_s"] is not None and q["lag_age_s"] > 0 for q in orders if q["lag"])
    assert "[audit]" in done.stderr  # progress
    # Capstan's lines only: Spark's own output went to the file named on the first line.
    assert not any(w in done.stderr for w in ("log4j", "WARN", "Setting default log level"))
    first = done.stderr.splitlines()[0]
    assert first.startswith("Spark's own output: "), first
    spark_log = Path(first.removeprefix("Spark's own output: ").split(" (")[0])
    assert "log4j" in spark_log.read_text()
    spark_log.unlink()
    page = (reports / "audit.html").read_text()
    assert "Consumer group Readers" in page and "<svg" in page and "no problem found" in page
    metrics = (reports / "audit.prom").read_text()
    assert 'capstan_audit_problems{kind="gap"} 0.0' in metrics
    assert "capstan_audit_last_run_ok 1.0" in metrics
    promtool = shutil.which("promtool")
    assert promtool, "promtool comes with scripts/chart_tools.sh"
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=metrics, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    pushed = http_get(f"http://{gateway_address}/metrics") or ""
    found = [x for x in pushed.splitlines() if x.startswith("capstan_audit_last_run_ok{")]
    assert len(found) == 1, pushed
    [ok] = found
    assert 'cluster="test-up"' in ok and 'job="capstan_audit"' in ok and ok.endswith(" 1")


def pull_one(address: str, topic: str, queue: int, offset: int) -> ppb.PulledMessage:
    reply = ppb_grpc.PullStub(open_channel(address, here=True)).PullMessages(
        ppb.PullMessagesRequest(topic=topic, queue_id=queue, offset=offset, max_messages=1),
        timeout=10,
    )
    [m] = reply.messages
    return m


def segment_of(broker: BrokerProcess, phys: int) -> tuple[Path, int]:
    """The CommitLog segment file holding physical offset `phys`, and the position in it."""
    segments = sorted((broker.root / "data" / "store" / "commitlog").iterdir())
    path = [p for p in segments if int(p.name) <= phys][-1]
    return path, phys - int(path.name)


def rewrite_body(broker: BrokerProcess, phys: int, body: bytes) -> None:
    """Replace the body of the record at `phys` with one as long, and fix both its CRCs:
    a valid record, only not the one the master holds there."""
    path, at = segment_of(broker, phys)
    with path.open("r+b") as f:
        f.seek(at)
        size = fmt.SIZE_AND_MAGIC.unpack(f.read(8))[0]
        f.seek(at)
        record = bytearray(f.read(size))
        length = fmt.RECORD_HEADER.unpack_from(record)[14]
        assert len(body) == length
        start = fmt.RECORD_HEADER_BYTES
        record[start : start + length] = body
        body_crc = zlib.crc32(body)
        record[8:12] = body_crc.to_bytes(4, "big")
        header_crc = zlib.crc32(record[:start], body_crc)
        tail = record[start + length : size - 4]
        record[size - 4 :] = zlib.crc32(tail, header_crc).to_bytes(4, "big")
        f.seek(at)
        f.write(record)


def test_faults_on_the_replicas_of_a_group_are_reported_precisely(
    spark: SparkSession, tmp_path: Path
):
    # No scrub: the audit's own read finds the flipped bit below, then the slave mends it.
    cluster = start_cluster(tmp_path, scrub_bytes_per_s=0)
    try:
        master, slave = cluster.ready("T", queues=2)
        s = stub(master.address)
        for i in range(100):
            reply, _ = send_to_queue(s, str(i % 2), v2_message("T", f"body-{i:04d}".encode()))
            assert reply.status.code == pb.OK, reply
        wait_until(lambda: slave.queue_ends("T", here=True) == [50, 50], 10, "the slave's copy")
        controller = f"127.0.0.1:{cluster.controller.port}"
        clean = audit(spark, controller=controller)
        assert clean.ok, clean.problems
        assert clean.records_checked == 200 and clean.replicas_read == 2

        # A flipped bit in the body of queue 0's offset 7, on the slave's disk.
        flipped = pull_one(slave.address, "T", 0, 7)
        path, at = segment_of(slave, flipped.commit_log_offset + fmt.RECORD_HEADER_BYTES)
        with path.open("r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x01]))
        # The slave's last two records of queue 1 replaced by other valid records.
        assert slave.stop() == 0
        for offset in (48, 49):
            m = pull_one(master.address, "T", 1, offset)
            rewrite_body(slave, m.commit_log_offset, f"fake-{offset:04d}".encode())
        slave.start()
        wait_until(lambda: cluster.settled(2), 30, "the slave back in sync")

        found = audit(spark, controller=controller)
        problems = sorted(
            (p.kind, p.topic, p.queue_id, p.replica, tuple(p.offsets)) for p in found.problems
        )
        assert problems == [
            ("replica_divergence", "T", 1, "", (48, 49)),
            ("unreadable", "T", 0, slave.address, (7,)),
        ], found.problems

        # The audit's read told the slave, which fetched the record again from the master.
        wait_until(
            lambda: metric(scrape(slave), "capstan_replica_healed_records_total") == 1,
            20,
            "the slave to mend the flipped bit",
        )
        mended = audit(spark, controller=controller)
        assert [(p.kind, p.queue_id, tuple(p.offsets)) for p in mended.problems] == [
            ("replica_divergence", 1, (48, 49))
        ], mended.problems
    finally:
        stop_cluster(cluster)


def commit(address: str, group: str, topic: str, queue: int, offset: int) -> None:
    cpb_grpc.ConsumerStub(open_channel(address)).CommitOffsets(
        cpb.CommitOffsetsRequest(
            group=group, offsets=[cpb.QueueOffset(topic=topic, queue_id=queue, offset=offset)]
        ),
        timeout=10,
    )


def test_offsets_behind_retention_and_past_the_end_are_reported(
    spark: SparkSession, tmp_path: Path
):
    broker = BrokerProcess(
        tmp_path,
        store={
            "commitlog_segment_bytes": 64 * 1024,
            "flush_mode": "SYNC_FLUSH",
            "file_reserved_hours": 0.0005,  # 1.8 s
            "clean_interval_ms": 300,
        },
    ).start()
    try:
        broker.create_topic("T", queues=2)
        broker.create_group("Slow")
        broker.create_group("Ahead")
        commit(broker.address, "Slow", "T", 0, 0)  # a group that consumed nothing yet
        commit(broker.address, "Ahead", "T", 1, 0)
        s = stub(broker.address)
        for i in range(300):
            reply, _ = send_to_queue(s, str(i % 2), v2_message("T", b"r" * 1000))
            assert reply.status.code == pb.OK, reply
        wait_until(lambda: _low(broker, 0) > 0, 30, "retention to remove queue 0's oldest")
        assert broker.stop() == 0
        offsets = broker.root / "data" / "store" / "config" / "consumerOffset.json"
        table = json.loads(offsets.read_text())
        table["offsetTable"]["T@Ahead"]["1"] = 160  # queue 1 ends at 150
        offsets.write_text(json.dumps(table))
        # Retention off for the rest: the first offset must not move between reading it
        # here and the audit's own read.
        settings = yaml.safe_load(broker.config.read_text())
        settings["store"]["file_reserved_hours"] = 1000.0
        broker.config.write_text(yaml.safe_dump(settings))
        broker.start()
        low = _low(broker, 0)

        found = audit(spark, brokers=(broker.address,))
        problems = sorted((p.kind, p.topic, p.queue_id, p.count) for p in found.problems)
        assert problems == [
            ("committed_below_min", "T", 0, low),
            ("committed_past_max", "T", 1, 1),
        ], found.problems
    finally:
        broker.stop()


def _low(broker: BrokerProcess, queue: int) -> int:
    from capstan.v1 import admin_pb2 as apb

    reply = broker.admin().DescribeTopic(apb.TopicRequest(name="T"), timeout=10)
    return reply.topic.queues[queue].min_offset
