"""`capstan bench spark`: records per second of the Spark read path
(`spark.read.format("capstan")`) and of the offset audit, beside a plain single-process
Python scan of the same data through the same API, in the same run.

One broker on 127.0.0.1 serves a topic of 8 queues filled beforehand (1M records of 100
bytes; 100k with --quick) and a consumer group halfway through it. The scan is the data
source's own slice reader run in one loop, with no Spark: what a script without Spark would
do. Spark runs in local mode (`local[*]`, the machine's cores); its first read, which
starts the Python workers, is timed apart from the measured (warm) one.

Prints a table, then one line of JSON with the figures (the last line of output).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from typing import Any

from capstan.bench.broker_bench import BrokerProcess
from capstan.broker.store.message import Message
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.properties import PROPERTY_KEYS, PROPERTY_UNIQ_KEY
from capstan.broker.store.subscription_groups import SubscriptionGroupConfig
from capstan.broker.store.topic_config import TopicConfig
from capstan.common.store_settings import FlushMode, StoreSettings

TOPIC = "SparkBench"
GROUP = "HalfWay"
QUEUES = 8
BODY = os.urandom(100)
BATCH = 1000


def _fill(store_dir: pathlib.Path, count: int) -> float:
    """Write `count` records straight into a broker's store; seconds taken."""
    store = MessageStore(
        store_dir,
        StoreSettings(flush_mode=FlushMode.ASYNC_FLUSH, commitlog_segment_bytes=256 * 1024 * 1024),
    )
    try:
        store.topics.put(TopicConfig(TOPIC, QUEUES, QUEUES))
        store.subscription_groups.put(SubscriptionGroupConfig(GROUP))
        started = time.perf_counter()
        for first in range(0, count, BATCH):
            batch = [
                Message(
                    TOPIC,
                    i % QUEUES,
                    BODY,
                    {PROPERTY_KEYS: f"k{i % 10_000}", PROPERTY_UNIQ_KEY: f"SPARK{i:024d}"},
                )
                for i in range(first, min(count, first + BATCH))
            ]
            result = store.put(batch)
            if not result.status.ok:
                raise RuntimeError(f"filling the store failed: {result}")
        for queue in range(QUEUES):
            store.consumer_offsets.commit(GROUP, TOPIC, queue, count // QUEUES // 2)
        return time.perf_counter() - started
    finally:
        store.close()


def _timed(what: str, run: Callable[[], int]) -> tuple[int, float]:
    print(f"-- {what} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    records = run()
    elapsed = time.perf_counter() - started
    print(f"   {records} records in {elapsed:.1f} s", file=sys.stderr, flush=True)
    return records, elapsed


def _python_scan(address: str) -> int:
    """Every record of the topic, one process, one queue after another, bodies checked."""
    from capstan.spark.capstan_source import Replica, plan_slices, queue_bounds, read_slice

    replica = Replica(address, address, True)
    slices = plan_slices(replica, TOPIC, queue_bounds(address, TOPIC), 1 << 62)
    records = 0
    for s in slices:
        for row in read_slice(s):
            if row[-1] is None or zlib.crc32(row[-1]) != row[-4]:
                raise RuntimeError(f"record {row[5]} of queue {row[4]} failed its check")
            records += 1
    return records


def _spark_read(spark: Any, address: str) -> int:
    from pyspark.sql import functions as F

    row = (
        spark.read.format("capstan")
        .option("brokers", address)
        .option("topic", TOPIC)
        .load()
        .agg(F.count("*").alias("n"), F.sum(F.col("crc_ok").cast("int")).alias("ok"))
        .collect()[0]
    )
    if row.n != row.ok:
        raise RuntimeError(f"{row.n - row.ok} records failed their CRC")
    return int(row.n)


def main(quick: bool = False, directory: str | None = None) -> None:
    count = 100_000 if quick else 1_000_000
    root = pathlib.Path(tempfile.mkdtemp(prefix="capstan-spark-bench-", dir=directory))
    figures: dict[str, float | int | None] = {"records": count}
    broker = BrokerProcess(root / "broker", "ASYNC_FLUSH")
    try:
        print(f"-- filling {count} records of {len(BODY)} bytes ...", file=sys.stderr, flush=True)
        fill_s = _fill(root / "broker" / "data" / "store", count)
        figures["fill_records_per_s"] = round(count / fill_s)
        address = broker.start()
        scanned, scan_s = _timed("plain Python scan, one process", lambda: _python_scan(address))
        figures["python_scan_records_per_s"] = round(scanned / scan_s)

        from capstan.spark.audit import audit
        from capstan.spark.session import spark_session

        started = time.perf_counter()
        spark = spark_session("local[*]", "capstan-bench")
        figures["spark_session_start_s"] = round(time.perf_counter() - started, 2)
        figures["spark_cores"] = spark.sparkContext.defaultParallelism
        try:
            from capstan.spark.capstan_source import CapstanDataSource

            spark.dataSource.register(CapstanDataSource)
            # The first read starts Spark's Python workers (imports, JIT): timed apart.
            _, first_s = _timed(
                "Spark read path, first (cold)", lambda: _spark_read(spark, address)
            )
            figures["spark_first_read_s"] = round(first_s, 2)
            read, read_s = _timed("Spark read path (warm)", lambda: _spark_read(spark, address))
            report: dict[str, Any] = {}

            def run_audit() -> int:
                found = audit(spark, brokers=(address,))
                report["ok"] = found.ok
                report["lag"] = sum(q.lag for q in found.lags)
                return found.records_checked

            audited, audit_s = _timed("Spark offset audit", run_audit)
        finally:
            spark.stop()
        if read != count or audited != count or scanned != count:
            raise RuntimeError(f"read {read}, audited {audited}, scanned {scanned} of {count}")
        if not report["ok"] or report["lag"] != count - count // QUEUES // 2 * QUEUES:
            raise RuntimeError(f"the audit of a sound topic reported {report}")
        figures["spark_read_records_per_s"] = round(read / read_s)
        figures["spark_audit_records_per_s"] = round(audited / audit_s)
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)
    scan = figures["python_scan_records_per_s"] or 1
    figures["ratio_spark_read_to_python_scan"] = round(
        float(figures["spark_read_records_per_s"] or 0) / float(scan), 2
    )
    figures["ratio_spark_audit_to_python_scan"] = round(
        float(figures["spark_audit_records_per_s"] or 0) / float(scan), 2
    )
    print()
    print(f"{'figure':<36} {'value':>14}")
    for key, value in figures.items():
        print(f"{key:<36} {value!s:>14}")
    print(json.dumps({"bench": "spark", "quick": quick, **figures}))
