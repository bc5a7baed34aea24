"""Topic compaction as a PySpark job: the latest record per key of a compact topic.

Per broker group: the job asks the group's master where each queue of the topic ends (the
cuts), reads every record below the cuts with `spark.read.format("capstan")`, and keeps, per
queue, the last record of each key; a record with the user property `tombstone` = `true`
is a tombstone (RocketMQ refuses empty bodies, so the marker is a property), kept until it
is older than the tombstone retention and then dropped with its key; a record without keys
is always kept. The kept (queue, offset, key, body CRC) are written to a manifest file
(capstan/common/compaction_manifest.py), checksummed, and streamed to every live replica of
the group (capstan.v1.Admin/CompactTopic). Each replica checks every kept record against
its own copy and swaps the compacted copy in whole, or changes nothing.

The job refuses to compact over damage: a record below a cut that a replica cannot read, or
whose body fails its CRC, stops the job for that group before anything is sent.

Killing the job (kill -9 of the driver) at any point leaves each replica as it was or, after
its swap, compacted; never in between. Records produced while the job runs sit past the
cuts and are untouched.

Run it as `capstan spark compact` (local mode) or with spark-submit (`main`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capstan.common.compaction_manifest import KeptRecord, ManifestFile, QueueCut, write_manifest
from capstan.spark.capstan_source import (
    CALL_TIMEOUT_S,
    ON_THE_REPLICA,
    CapstanDataSource,
    ReadOptions,
    Replica,
    queue_bounds,
    queue_mapping,
    replicas,
)
from capstan.spark.cr_status import StatusTarget, write_status
from capstan.spark.job_arguments import (
    TOMBSTONE_PROPERTY,
    TOMBSTONE_RETENTION_ATTRIBUTE,
    add_compact_arguments,
    parse_job_arguments,
    targets,
)
from capstan.spark.session import spark_session

if TYPE_CHECKING:
    from capstan.common.queue_mapping import QueueMapping

DEFAULT_TOMBSTONE_RETENTION_MS = 24 * 3600 * 1000
UPLOAD_BATCH = 2048
HOLD_ENV = "CAPSTAN_SPARK_HOLD_AT"
"""Test hook: the job stops at this step (read, manifest, upload) and waits to be killed."""

Progress = Callable[[str], None]


class CompactionFailed(Exception):
    """The job could not compact a group; nothing was sent to its replicas."""


@dataclass
class ReplicaResult:
    address: str
    master: bool
    generation: int = 0
    kept: int = 0
    dropped: int = 0
    compacted_bytes: int = 0
    commitlog_bytes_freed: int = 0
    error: str = ""


@dataclass
class GroupResult:
    group: str
    cuts: dict[int, int]
    records_read: int = 0
    kept: int = 0
    tombstones_dropped: int = 0
    manifest_sha256: str = ""
    replicas: list[ReplicaResult] = field(default_factory=list)
    error: str = ""


@dataclass
class CompactionResult:
    topic: str
    job: str
    started_ms: int
    finished_ms: int = 0
    groups: list[GroupResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(not g.error and all(not r.error for r in g.replicas) for g in self.groups)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def compact(
    spark: Any,
    topic: str,
    controller: str = "",
    brokers: tuple[str, ...] = (),
    tombstone_retention_ms: int | None = None,
    work_dir: Path | None = None,
    progress: Progress = lambda line: None,
) -> CompactionResult:
    """Compact `topic` on every broker group (from the controller, or standalone brokers)."""
    spark.dataSource.register(CapstanDataSource)
    job = f"compact-{topic}-{uuid.uuid4().hex[:8]}"
    result = CompactionResult(topic, job, _now_ms())
    options = ReadOptions(topic, controller, brokers, True, 1, {}, 30.0)
    by_group: dict[str, list[Replica]] = {}
    for replica in replicas(options):
        by_group.setdefault(replica.group, []).append(replica)
    if not by_group:
        raise CompactionFailed("no live broker to compact on")
    with tempfile.TemporaryDirectory(dir=work_dir) as scratch:
        for group, members in sorted(by_group.items()):
            members.sort(key=lambda r: not r.master)
            outcome = _compact_group(
                spark, topic, group, members, tombstone_retention_ms, Path(scratch), progress, job
            )
            result.groups.append(outcome)
    result.finished_ms = _now_ms()
    return result


def _compact_group(
    spark: Any,
    topic: str,
    group: str,
    members: list[Replica],
    tombstone_retention_ms: int | None,
    scratch: Path,
    progress: Progress,
    job: str,
) -> GroupResult:
    master = members[0]
    if not master.master:
        return GroupResult(group, {}, error="the group has no live master to read from")
    retention = (
        tombstone_retention_ms
        if tombstone_retention_ms is not None
        else _topic_tombstone_retention(master.address, topic)
    )
    cuts = {queue_id: high for queue_id, _, high in queue_bounds(master.address, topic)}
    mapping = queue_mapping(master.address, topic)
    outcome = GroupResult(group, cuts)
    progress(
        f"{group}: reading {topic} below the cuts "
        + ", ".join(f"q{q}<{b}" for q, b in sorted(cuts.items()))
        + f" from {master.address}"
    )
    _hold("read", progress)
    try:
        manifest = _plan(spark, topic, master, cuts, retention, scratch, outcome, progress, mapping)
    except CompactionFailed as exc:
        outcome.error = str(exc)
        progress(f"{group}: not compacted: {exc}")
        return outcome
    _hold("manifest", progress)
    for replica in members:
        outcome.replicas.append(
            send_manifest(replica, manifest, f"{group} {topic}", progress, f"{job}/{group}")
        )
    return outcome


def _plan(
    spark: Any,
    topic: str,
    master: Replica,
    cuts: dict[int, int],
    retention_ms: int,
    scratch: Path,
    outcome: GroupResult,
    progress: Progress,
    mapping: QueueMapping | None = None,
) -> ManifestFile:
    """The manifest of what to keep below the cuts. The rows and the cuts are in the
    offsets clients see; the manifest is in the store's own, so a static topic's logic
    offsets are turned into this group's physical ones (`mapping`)."""
    from pyspark.sql import functions as F

    group = outcome.group

    def stored(queue_id: int, offset: int) -> int:
        if mapping is None or not 0 <= queue_id < mapping.total_queues:
            return offset
        return mapping.physical_offset(group, queue_id, offset)

    rows = (
        spark.read.format("capstan")
        .option("brokers", master.address)
        .option("topic", topic)
        .option("endOffsets", ",".join(f"{q}:{b}" for q, b in sorted(cuts.items())))
        .load()
        .select(
            "queue_id",
            "queue_offset",
            F.coalesce("keys", F.lit("")).alias("key"),
            "body_crc",
            "readable",
            "crc_ok",
            (F.lower(F.col("properties")[TOMBSTONE_PROPERTY]) == "true").alias("tombstone"),
            "store_time",
        )
        .cache()
    )
    try:
        damaged = rows.filter(~F.col("readable") | ~F.col("crc_ok")).limit(5).collect()
        if damaged:
            where = ", ".join(f"queue {r.queue_id} offset {r.queue_offset}" for r in damaged)
            raise CompactionFailed(f"damaged records below the cuts ({where}); audit the topic")
        outcome.records_read = rows.count()
        keyed = rows.filter(F.col("key") != "")
        latest = (
            keyed.groupBy("queue_id", "key")
            .agg(F.max_by(F.struct(*rows.columns), "queue_offset").alias("r"))
            .select("r.*")
        )
        cutoff = F.lit(_utc(_now_ms() - retention_ms))
        expired = F.coalesce(F.col("tombstone"), F.lit(False)) & (F.col("store_time") < cutoff)
        outcome.tombstones_dropped = latest.filter(expired).count()
        kept = (
            latest.filter(~expired)
            .unionByName(rows.filter(F.col("key") == ""))
            .select("queue_id", "queue_offset", "key", "body_crc")
            .orderBy("queue_id", "queue_offset")
        )
        records = (
            KeptRecord(r.queue_id, stored(r.queue_id, r.queue_offset), r.key, r.body_crc)
            for r in kept.toLocalIterator()
        )
        path = scratch / f"{outcome.group}-{topic}.manifest"
        ordered = [QueueCut(q, stored(q, b)) for q, b in sorted(cuts.items())]
        manifest = write_manifest(path, topic, ordered, records)
    finally:
        rows.unpersist()
    outcome.kept = manifest.count
    outcome.manifest_sha256 = manifest.sha256
    progress(
        f"{outcome.group}: {outcome.records_read} records read, {manifest.count} kept, "
        f"{outcome.tombstones_dropped} expired tombstones dropped; manifest {manifest.sha256[:12]}"
    )
    return manifest


def send_manifest(
    replica: Replica, manifest: ManifestFile, what: str, progress: Progress, job: str = ""
) -> ReplicaResult:
    """Send the manifest to one replica; `job` names this run (the same on every replica
    of the group), `what` is for the progress lines."""
    from capstan.client.admin import BlockingAdminClient
    from capstan.client.errors import ClientError
    from capstan.security.credentials import client_access
    from capstan.v1 import admin_pb2 as apb

    result = ReplicaResult(replica.address, replica.master)
    role = "master" if replica.master else "slave"
    progress(f"{what}: sending the manifest to {replica.address} ({role})")

    def chunks() -> Iterator[apb.CompactionChunk]:
        yield apb.CompactionChunk(
            header=apb.CompactionHeader(
                topic=manifest.topic,
                cuts=[
                    apb.CompactionCut(queue_id=c.queue_id, boundary=c.boundary)
                    for c in manifest.cuts
                ],
                job=job or what,
            )
        )
        sent = 0
        for batch in manifest.records(UPLOAD_BATCH):
            yield apb.CompactionChunk(
                kept=apb.CompactionKeptBatch(
                    records=[
                        apb.CompactionKept(
                            queue_id=r.queue_id,
                            queue_offset=r.queue_offset,
                            key=r.key,
                            body_crc=r.body_crc,
                        )
                        for r in batch
                    ]
                )
            )
            sent += len(batch)
            progress(f"{what}: {replica.address}: {sent}/{manifest.count} kept records sent")
            if sent * 2 >= manifest.count:
                _hold("upload", progress)
        yield apb.CompactionChunk(
            trailer=apb.CompactionTrailer(sha256=manifest.sha256, record_count=manifest.count)
        )

    try:
        with BlockingAdminClient(
            replica.address, metadata=ON_THE_REPLICA, **client_access()
        ) as admin:
            # The broker may first wait for a swap of the topic already under way.
            reply = admin.compact_topic(chunks(), 2 * CALL_TIMEOUT_S + manifest.count / 2000)
    except ClientError as exc:
        result.error = str(exc)
        progress(f"{what}: {replica.address} refused: {result.error}")
        return result
    result.generation = reply.generation
    result.kept = sum(q.kept for q in reply.queues)
    result.dropped = sum(q.dropped for q in reply.queues)
    result.compacted_bytes = sum(q.bytes for q in reply.queues)
    result.commitlog_bytes_freed = reply.commitlog_bytes_freed
    progress(
        f"{what}: {replica.address} swapped in generation {reply.generation}: "
        f"{result.kept} kept, {result.dropped} no longer delivered, "
        f"{result.commitlog_bytes_freed} CommitLog bytes freed"
    )
    return result


def _topic_tombstone_retention(address: str, topic: str) -> int:
    from capstan.client.admin import BlockingAdminClient
    from capstan.security.credentials import client_access

    with BlockingAdminClient(address, timeout_s=CALL_TIMEOUT_S, **client_access()) as admin:
        reply = admin.describe_topic(topic)
    raw = reply.topic.topic.attributes.get(TOMBSTONE_RETENTION_ATTRIBUTE, "")
    return int(raw) if raw.isdigit() else DEFAULT_TOMBSTONE_RETENTION_MS


def _hold(step: str, progress: Progress) -> None:
    if os.environ.get(HOLD_ENV) == step:
        progress(f"holding at {step}")
        time.sleep(3600)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _utc(ms: int) -> Any:
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The job's arguments as spark-submit passes them (exits naming a wrong one)."""
    return parse_job_arguments("capstan-spark-compact", __doc__, add_compact_arguments, argv)


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: `spark-submit .../compact.py TOPIC --server H:P`."""
    return run(arguments(argv), master="")


def run(args: argparse.Namespace, master: str) -> int:
    def progress(line: str) -> None:
        print(f"[compact] {line}", file=sys.stderr, flush=True)

    target = StatusTarget.parse(args.status_of) if args.status_of else None
    started = _now_ms()
    spark = spark_session(master, "capstan-compact", getattr(args, "spark_log", None))
    try:
        controller, brokers = targets(args)
        result = compact(
            spark,
            args.topic,
            controller=controller,
            brokers=brokers,
            tombstone_retention_ms=args.tombstone_retention_ms,
            progress=progress,
        )
    except Exception as exc:  # noqa: BLE001 - reported, and the exit status says so
        print(f"capstan spark compact: {exc}", file=sys.stderr)
        if target is not None:
            write_status(target, _status(started, None, str(exc)))
        return 1
    finally:
        spark.stop()
    if target is not None:
        write_status(target, _status(started, result, ""))
        progress(f"result written to the status of {args.status_of}")
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        for g in result.groups:
            state = g.error or ", ".join(
                f"{r.address} {'generation ' + str(r.generation) if not r.error else r.error}"
                for r in g.replicas
            )
            print(f"{result.topic} on {g.group}: {g.kept} of {g.records_read} kept; {state}")
    return 0 if result.ok else 1


def _status(started_ms: int, result: CompactionResult | None, error: str) -> dict[str, Any]:
    """What a Topic's status.compaction says about the last run."""
    status: dict[str, Any] = {
        "lastRunTime": _utc(started_ms).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "durationSeconds": round((_now_ms() - started_ms) / 1000, 1),
    }
    if result is None:
        return {**status, "result": "Failed", "message": error}
    replicas = [r for g in result.groups for r in g.replicas]
    problems = [g.error for g in result.groups if g.error] + [
        f"{r.address}: {r.error}" for r in replicas if r.error
    ]
    return {
        **status,
        "result": "Succeeded" if result.ok else "Failed",
        "recordsRead": sum(g.records_read for g in result.groups),
        "kept": sum(g.kept for g in result.groups),
        "tombstonesDropped": sum(g.tombstones_dropped for g in result.groups),
        "replicasCompacted": sum(1 for r in replicas if not r.error),
        "commitLogBytesFreed": sum(r.commitlog_bytes_freed for r in replicas),
        "message": "; ".join(problems) or "compacted on every live replica",
    }


if __name__ == "__main__":
    sys.exit(main())
