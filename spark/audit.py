"""Offset audit as a PySpark job: every consumer group's committed offsets against the data,
and the data of every replica against itself and the other replicas.

What it checks (`Problem.kind`):

- `committed_past_max`: a group's committed offset beyond its queue's end.
- `committed_below_min`: a group's committed offset below its queue's first message:
  messages removed by retention before the group consumed them (compact topics excepted:
  there the records below the first kept one were superseded, not lost).
- `unreadable`: a consume-queue unit whose record a replica cannot read (it fails its CRC,
  points past the CommitLog or is a hole). A slave mends a record failing its CRC from its
  master once a read (this one's too) or its scrub meets it.
- `crc_mismatch`: a record read whole whose body no longer matches its stored CRC.
- `replica_divergence`: replicas of a broker group holding different records (by body CRC
  or CommitLog offset) at the same queue offset.
- `replica_missing`: a replica lacking a queue offset inside its own bounds that another
  replica of its group holds.
- `gap`: queue offsets inside a replica's bounds that it returned nothing for (compact
  topics excepted, where gaps are what compaction leaves).

And, without judging: per consumer group, topic and queue the committed offset, the
queue's bounds, the lag and its age (how long ago the oldest unconsumed message was
stored), messages in flight; per group the messages in its retry and dead-letter topics.

It reads user topics and the groups' retry and dead-letter topics (not the broker's
internal ones) from every live replica with `spark.read.format("capstan")`, and the
committed offsets and bounds from each group's master (capstan.v1.Admin).

Output: `AuditReport` as JSON, an HTML report with a lag chart per consumer group, and
Prometheus metrics (written in the text format for node_exporter's textfile collector,
and pushed to a Pushgateway when one is given). Run it as `capstan spark audit` (local
mode) or with spark-submit (`main`); the exit status is 1 when a problem was found.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from capstan.security.credentials import client_access
from capstan.spark.audit_findings import (
    AuditReport,
    GroupBacklog,
    Problem,
    QueueLag,
)
from capstan.spark.audit_report import push, write_reports
from capstan.spark.capstan_source import (
    CALL_TIMEOUT_S,
    ON_THE_REPLICA,
    CapstanDataSource,
    ReadOptions,
    Replica,
    replicas,
)
from capstan.spark.cr_status import StatusTarget, write_status
from capstan.spark.job_arguments import add_audit_arguments, parse_job_arguments, targets

if TYPE_CHECKING:
    from capstan.client.admin import BlockingAdminClient
    from capstan.common.queue_mapping import QueueMapping

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
MAX_OFFSETS_LISTED = 20

Progress = Callable[[str], None]


@dataclass(frozen=True)
class QueueBounds:
    broker_group: str
    replica: str
    master: bool
    topic: str
    queue_id: int
    low: int
    high: int
    compact: bool
    elsewhere: tuple[tuple[int, int], ...] = ()
    """A static topic's logic queue: the stretches [start, end) inside the bounds that
    other groups hold (not gaps: this group never had them)."""


def audit(
    spark: Any,
    controller: str = "",
    brokers: tuple[str, ...] = (),
    topics: tuple[str, ...] = (),
    progress: Progress = lambda line: None,
) -> AuditReport:
    """Audit every broker group (from the controller, or standalone brokers)."""
    spark.dataSource.register(CapstanDataSource)
    report = AuditReport(_now_ms())
    found = replicas(ReadOptions("-", controller, brokers, True, 1, {}, 30.0))
    if not found:
        raise RuntimeError("no live broker to audit")
    report.broker_groups = sorted({r.group for r in found})
    report.replicas_read = len(found)
    committed: list[dict[str, Any]] = []
    bounds: list[QueueBounds] = []
    for replica in found:
        # A master's committed offsets before its bounds: both only grow, so a group
        # consuming meanwhile never seems to have committed past a queue's end.
        if replica.master:
            committed += _committed(replica)
        bounds += _bounds(replica, topics)
    masters = {r.group for r in found if r.master}
    for group in sorted(set(report.broker_groups) - masters):
        progress(f"{group}: no live master; committed offsets not audited there")
    scanned = sorted({b.topic for b in bounds})
    report.topics_read = scanned
    progress(
        f"auditing {len(scanned)} topics on {len(report.broker_groups)} broker groups "
        f"({len(found)} replicas), {len(committed)} committed offsets"
    )
    rows = _read(spark, controller, brokers, scanned, progress)
    try:
        report.records_checked = rows.count()
        progress(f"{report.records_checked} records read")
        report.problems += _record_problems(rows)
        report.problems += _gap_problems(spark, rows, bounds)
        report.problems += _replica_problems(spark, rows, bounds)
        report.lags, offset_problems = _lags(spark, rows, bounds, committed)
        report.problems += offset_problems
    finally:
        rows.unpersist()
    report.backlogs = _backlogs(bounds, committed)
    report.finished_ms = _now_ms()
    progress(
        f"audit done: {len(report.problems)} problems"
        + "".join(f", {k} {n}" for k, n in report.problem_counts().items() if n)
    )
    return report


def _admin(address: str) -> BlockingAdminClient:
    """Admin on the replica itself: a slave answers with its own queues and offsets."""
    from capstan.client.admin import BlockingAdminClient

    return BlockingAdminClient(
        address, timeout_s=CALL_TIMEOUT_S, metadata=ON_THE_REPLICA, **client_access()
    )


def _bounds(replica: Replica, only: tuple[str, ...]) -> list[QueueBounds]:
    """Every queue of the topics to audit on one replica, read from that replica."""
    from capstan.client.errors import NotFound
    from capstan.client.queue_mapping_wire import mapping_from_wire
    from capstan.v1 import admin_pb2 as apb

    found: list[QueueBounds] = []
    with _admin(replica.address) as admin:
        reply = admin.list_topics(apb.ListTopicsRequest(include_system=True))
        for status in reply.topics:
            name = status.topic.name
            group_topic = name.startswith((RETRY_PREFIX, DLQ_PREFIX))
            if (status.system and not group_topic) or (only and name not in only):
                continue
            compact = status.topic.attributes.get("cleanup.policy", "").upper() in (
                "COMPACT",
                "COMPACTION",
            )
            mapping = None
            if not status.system:
                try:
                    mapping = mapping_from_wire(admin.get_queue_mapping(name).mapping)
                except NotFound:
                    pass  # not a static topic
            found.extend(
                QueueBounds(
                    replica.group,
                    replica.address,
                    replica.master,
                    name,
                    q.queue_id,
                    q.min_offset,
                    q.max_offset,
                    compact,
                    _held_elsewhere(mapping, replica.group, q.queue_id),
                )
                for q in status.queues
            )
    return found


def _held_elsewhere(
    mapping: QueueMapping | None, group: str, queue_id: int
) -> tuple[tuple[int, int], ...]:
    if mapping is None or not 0 <= queue_id < mapping.total_queues:
        return ()
    return tuple(mapping.held_elsewhere(group, queue_id))


def _outside(
    spans: list[tuple[int, int]], held: tuple[tuple[int, int], ...]
) -> list[tuple[int, int]]:
    """`spans` without the stretches `held` (each [start, end))."""
    for h_start, h_end in held:
        cut = []
        for start, end in spans:
            if end <= h_start or start >= h_end:
                cut.append((start, end))
                continue
            if start < h_start:
                cut.append((start, h_start))
            if end > h_end:
                cut.append((h_end, end))
        spans = cut
    return spans


def _committed(master: Replica) -> list[dict[str, Any]]:
    with _admin(master.address) as admin:
        reply = admin.list_groups()
    return [
        {
            "consumer_group": g.group.name,
            "broker_group": master.group,
            "topic": o.topic,
            "queue_id": o.queue_id,
            "committed": o.committed_offset,
            "inflight": o.inflight,
        }
        for g in reply.groups
        for o in g.offsets
    ]


AUDITED_COLUMNS = (
    "broker_group",
    "replica",
    "master_replica",
    "topic",
    "queue_id",
    "queue_offset",
    "physical_offset",
    "body_crc",
    "crc_ok",
    "readable",
    "store_time",
)


def _read(
    spark: Any, controller: str, brokers: tuple[str, ...], topics: list[str], progress: Progress
) -> Any:
    from pyspark.sql.types import StructType

    from capstan.spark.capstan_source import SCHEMA

    frames = []
    for topic in topics:
        reader = spark.read.format("capstan").option("topic", topic).option("replicas", "all")
        if controller:
            reader = reader.option("controller", controller)
        else:
            reader = reader.option("brokers", ",".join(brokers))
        frames.append(reader.load().select(*AUDITED_COLUMNS))
    if not frames:
        schema = StructType([f for f in SCHEMA.fields if f.name in AUDITED_COLUMNS])
        return spark.createDataFrame([], schema).cache()
    rows = frames[0]
    for frame in frames[1:]:
        rows = rows.unionByName(frame)
    progress(f"reading {len(topics)} topics")
    return rows.cache()


def _where(row: Any) -> tuple[str, str, int]:
    return row.broker_group, row.topic, row.queue_id


def _record_problems(rows: Any) -> list[Problem]:
    from pyspark.sql import functions as F

    bad = (
        rows.filter(~F.col("readable") | ~F.coalesce(F.col("crc_ok"), F.lit(True)))
        .withColumn(
            "kind", F.when(F.col("readable"), F.lit("crc_mismatch")).otherwise(F.lit("unreadable"))
        )
        .groupBy("kind", "broker_group", "replica", "topic", "queue_id")
        .agg(
            F.count("*").alias("n"),
            F.slice(F.sort_array(F.collect_list("queue_offset")), 1, MAX_OFFSETS_LISTED).alias(
                "offsets"
            ),
        )
        .collect()
    )
    problems = []
    for r in bad:
        what = (
            "records whose body fails its stored CRC"
            if r.kind == "crc_mismatch"
            else "consume-queue units whose record cannot be read (CRC, hole or past the log)"
        )
        problems.append(
            Problem(r.kind, *_where(r), f"{r.n} {what}", r.replica, r.n, list(r.offsets))
        )
    return problems


def _bounds_frame(spark: Any, bounds: list[QueueBounds]) -> Any:
    from pyspark.sql import functions as F

    data = [
        (b.broker_group, b.replica, b.topic, b.queue_id, b.low, b.high, b.compact) for b in bounds
    ]
    schema = (
        "broker_group string, replica string, topic string, queue_id int, low long, "
        "high long, compact boolean"
    )
    return F.broadcast(spark.createDataFrame(data, schema))


def _gap_problems(spark: Any, rows: Any, bounds: list[QueueBounds]) -> list[Problem]:
    """Offsets in a replica's [low, high) it returned no row for (records, or unreadable
    units, both are rows). The bounds were read before the data: offsets retention took
    in between are not counted (the low is taken again below)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = ["broker_group", "replica", "topic", "queue_id"]
    ranges = _bounds_frame(spark, [b for b in bounds if not b.compact])
    seen = rows.join(ranges, keys).filter(
        (F.col("queue_offset") >= F.col("low")) & (F.col("queue_offset") < F.col("high"))
    )
    # Each run of missing offsets: between consecutive rows, and at either end of the range.
    w = Window.partitionBy(*keys).orderBy("queue_offset")
    edges = seen.select(
        *keys,
        "low",
        "high",
        "queue_offset",
        F.lag("queue_offset").over(w).alias("previous"),
        F.lead("queue_offset").over(w).alias("following"),
    )
    inner = edges.filter(
        F.col("previous").isNotNull() & (F.col("queue_offset") > F.col("previous") + 1)
    ).select(*keys, (F.col("previous") + 1).alias("start"), F.col("queue_offset").alias("end"))
    head = edges.filter(F.col("previous").isNull() & (F.col("queue_offset") > F.col("low"))).select(
        *keys, F.col("low").alias("start"), F.col("queue_offset").alias("end")
    )
    tail = edges.filter(
        F.col("following").isNull() & (F.col("queue_offset") + 1 < F.col("high"))
    ).select(*keys, (F.col("queue_offset") + 1).alias("start"), F.col("high").alias("end"))
    present = seen.select(*keys).distinct()
    empty = (
        ranges.filter(F.col("high") > F.col("low"))
        .join(present, keys, "left_anti")
        .select(*keys, F.col("low").alias("start"), F.col("high").alias("end"))
    )
    runs = inner.unionByName(head).unionByName(tail).unionByName(empty).collect()
    by_queue: dict[tuple[str, str, str, int], list[tuple[int, int]]] = {}
    for r in runs:
        by_queue.setdefault((r.broker_group, r.replica, r.topic, r.queue_id), []).append(
            (r.start, r.end)
        )
    lows_now = _lows_now(bounds)
    held = {(b.replica, b.topic, b.queue_id): b.elsewhere for b in bounds if b.elsewhere}
    problems = []
    for (group, replica, topic, queue_id), spans in sorted(by_queue.items()):
        low_now = lows_now.get((replica, topic, queue_id), 0)
        spans = [(max(s, low_now), e) for s, e in sorted(spans) if e > low_now]
        spans = _outside(spans, held.get((replica, topic, queue_id), ()))
        missing = sum(e - s for s, e in spans)
        if not missing:
            continue
        offsets = [o for s, e in spans for o in range(s, min(e, s + MAX_OFFSETS_LISTED))]
        listed = ", ".join(f"{s}..{e - 1}" for s, e in spans[:5])
        problems.append(
            Problem(
                "gap",
                group,
                topic,
                queue_id,
                f"{missing} offsets inside the queue's bounds returned nothing ({listed})",
                replica,
                missing,
                offsets[:MAX_OFFSETS_LISTED],
            )
        )
    return problems


def _lows_now(bounds: list[QueueBounds]) -> dict[tuple[str, str, int], int]:
    """Each queue's minimum now, after the read (retention may have moved it)."""
    replicas_seen = {(b.broker_group, b.replica, b.master) for b in bounds}
    topics = tuple(sorted({b.topic for b in bounds}))
    lows = {}
    for group, address, master in replicas_seen:
        for b in _bounds(Replica(group, address, master), topics):
            lows[(b.replica, b.topic, b.queue_id)] = b.low
    return lows


def _replica_problems(spark: Any, rows: Any, bounds: list[QueueBounds]) -> list[Problem]:
    """Offsets where a group's replicas disagree: a different record, or one lacking it."""
    from pyspark.sql import functions as F

    keys = ["broker_group", "topic", "queue_id"]
    replica_count: dict[tuple[str, str, int], set[str]] = {}
    for b in bounds:
        replica_count.setdefault((b.broker_group, b.topic, b.queue_id), set()).add(b.replica)
    if all(len(r) < 2 for r in replica_count.values()):
        return []
    ranges = _bounds_frame(spark, bounds)
    # Per offset: how many versions the replicas hold (an unreadable unit is no version:
    # countDistinct skips its nulls; it is reported as unreadable), which replicas hold it,
    # and which should (it lies inside their bounds).
    per_offset = (
        rows.groupBy(*keys, "queue_offset")
        .agg(
            F.countDistinct("body_crc", "physical_offset").alias("versions"),
            F.collect_set("replica").alias("holders"),
        )
        .join(ranges.select(*keys, "replica", "low", "high"), keys)
        .filter((F.col("queue_offset") >= F.col("low")) & (F.col("queue_offset") < F.col("high")))
        .groupBy(*keys, "queue_offset", "versions", "holders")
        .agg(F.collect_set("replica").alias("expected"))
    )
    divergent = (
        per_offset.filter(F.col("versions") > 1)
        .groupBy(*keys)
        .agg(
            F.count("*").alias("n"),
            F.slice(F.sort_array(F.collect_list("queue_offset")), 1, MAX_OFFSETS_LISTED).alias(
                "offsets"
            ),
        )
        .collect()
    )
    missing = (
        per_offset.select(
            *keys, "queue_offset", F.explode(F.array_except("expected", "holders")).alias("replica")
        )
        .groupBy(*keys, "replica")
        .agg(
            F.count("*").alias("n"),
            F.slice(F.sort_array(F.collect_list("queue_offset")), 1, MAX_OFFSETS_LISTED).alias(
                "offsets"
            ),
        )
        .collect()
    )
    problems = [
        Problem(
            "replica_divergence",
            *_where(r),
            f"{r.n} offsets where the replicas hold different records (body CRC or CommitLog "
            "offset differ)",
            "",
            r.n,
            list(r.offsets),
        )
        for r in divergent
    ]
    problems += [
        Problem(
            "replica_missing",
            *_where(r),
            f"{r.n} offsets inside this replica's bounds that another replica holds and it "
            "does not",
            r.replica,
            r.n,
            list(r.offsets),
        )
        for r in missing
    ]
    return problems


def _lags(
    spark: Any, rows: Any, bounds: list[QueueBounds], committed: list[dict[str, Any]]
) -> tuple[list[QueueLag], list[Problem]]:
    from pyspark.sql import functions as F

    masters = {(b.broker_group, b.topic, b.queue_id): b for b in bounds if b.master}
    lags: list[QueueLag] = []
    problems: list[Problem] = []
    oldest = {}
    if committed:
        offsets = F.broadcast(
            spark.createDataFrame(
                [(c["broker_group"], c["topic"], c["queue_id"], c["committed"]) for c in committed],
                "broker_group string, topic string, queue_id int, committed long",
            ).distinct()
        )
        for r in (
            rows.filter(F.col("master_replica") & F.col("readable"))
            .join(offsets, ["broker_group", "topic", "queue_id"])
            .filter(F.col("queue_offset") >= F.col("committed"))
            .groupBy("broker_group", "topic", "queue_id", "committed")
            .agg(F.min("store_time").alias("oldest"))
            .collect()
        ):
            oldest[(r.broker_group, r.topic, r.queue_id, r.committed)] = r.oldest
    now_s = time.time()
    for c in committed:
        b = masters.get((c["broker_group"], c["topic"], c["queue_id"]))
        if b is None:
            continue
        where = (c["broker_group"], c["topic"], c["queue_id"])
        lag = max(0, b.high - max(c["committed"], b.low))
        stored = oldest.get((*where, c["committed"]))
        age = round(now_s - stored.timestamp(), 3) if lag and stored is not None else None
        lags.append(
            QueueLag(
                c["consumer_group"],
                *where,
                c["committed"],
                b.low,
                b.high,
                lag,
                age,
                c["inflight"],
            )
        )
        if c["committed"] > b.high:
            problems.append(
                Problem(
                    "committed_past_max",
                    *where,
                    f"group {c['consumer_group']} committed {c['committed']}, past the end "
                    f"{b.high}",
                    offsets=[c["committed"]],
                )
            )
        elif c["committed"] < b.low and not b.compact:
            lost = b.low - c["committed"]
            problems.append(
                Problem(
                    "committed_below_min",
                    *where,
                    f"group {c['consumer_group']} committed {c['committed']}, below the first "
                    f"message {b.low}: {lost} messages removed before it consumed them",
                    count=lost,
                    offsets=[c["committed"]],
                )
            )
    return lags, problems


def _backlogs(bounds: list[QueueBounds], committed: list[dict[str, Any]]) -> list[GroupBacklog]:
    groups = sorted({c["consumer_group"] for c in committed} | _groups_with_topics(bounds))
    backlogs = []
    for group in groups:
        backlog = GroupBacklog(group)
        for b in bounds:
            if b.master and b.topic == RETRY_PREFIX + group:
                backlog.retry_messages += b.high - b.low
            elif b.master and b.topic == DLQ_PREFIX + group:
                backlog.dlq_messages += b.high - b.low
        backlogs.append(backlog)
    return backlogs


def _groups_with_topics(bounds: Iterable[QueueBounds]) -> set[str]:
    found = set()
    for b in bounds:
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            if b.topic.startswith(prefix):
                found.add(b.topic[len(prefix) :])
    return found


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def run(args: argparse.Namespace, master: str) -> int:
    """Run the audit; 0 when it found nothing wrong, 1 when it found a problem, 2 when it
    could not run."""
    from capstan.spark.session import spark_session

    def progress(line: str) -> None:
        print(f"[audit] {line}", file=sys.stderr, flush=True)

    target = StatusTarget.parse(args.status_of) if args.status_of else None
    started = _now_ms()
    spark = spark_session(master, "capstan-audit", getattr(args, "spark_log", None))
    try:
        controller, brokers = targets(args)
        report = audit(spark, controller, brokers, tuple(args.topic), progress)
    except Exception as exc:  # noqa: BLE001 - any failure to run is exit status 2
        print(f"capstan spark audit: could not run: {exc}", file=sys.stderr)
        if target is not None:
            write_status(target, {**_status_times(started), "result": "Error", "message": str(exc)})
        return 2
    finally:
        spark.stop()
    if args.report_dir is not None:
        for path in write_reports(report, args.report_dir):
            progress(f"wrote {path}")
    if args.pushgateway:
        push(report, args.pushgateway, args.cluster)
        progress(f"metrics pushed to {args.pushgateway}")
    if target is not None:
        write_status(target, _status(started, report))
        progress(f"result written to the status of {args.status_of}")
    if args.json:
        print(json.dumps(report.to_json(), default=str))
    else:
        print(summary(report))
    return 0 if report.ok else 1


def _status_times(started_ms: int) -> dict[str, Any]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_ms / 1000))
    return {"lastRunTime": stamp, "durationSeconds": round((_now_ms() - started_ms) / 1000, 1)}


def _status(started_ms: int, report: AuditReport) -> dict[str, Any]:
    """What a BrokerGroup's status.audit says about the last run."""
    found = {kind: n for kind, n in report.problem_counts().items() if n}
    return {
        **_status_times(started_ms),
        "result": "Clean" if report.ok else "ProblemsFound",
        "recordsChecked": report.records_checked,
        "problems": found,
        "totalLag": sum(q.lag for q in report.lags),
        "message": "; ".join(p.detail for p in report.problems[:5]) or "no problem found",
    }


def summary(report: AuditReport) -> str:
    lines = [
        f"audited {report.records_checked} records of {len(report.topics_read)} topics on "
        f"{report.replicas_read} replicas: "
        + ("no problem found" if report.ok else f"{len(report.problems)} problems")
    ]
    for p in report.problems:
        replica = f" on {p.replica}" if p.replica else ""
        lines.append(f"  {p.kind}: {p.broker_group} {p.topic} q{p.queue_id}{replica}: {p.detail}")
    behind = [q for q in report.lags if q.lag]
    for q in sorted(behind, key=lambda q: -q.lag)[:10]:
        age = f", oldest {q.lag_age_s:.0f} s" if q.lag_age_s is not None else ""
        lines.append(f"  lag {q.lag}{age}: {q.consumer_group} on {q.topic} q{q.queue_id}")
    return "\n".join(lines)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The job's arguments as spark-submit passes them (exits naming a wrong one)."""
    return parse_job_arguments("capstan-spark-audit", __doc__, add_audit_arguments, argv)


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: `spark-submit .../audit.py --server H:P`."""
    return run(arguments(argv), master="")


if __name__ == "__main__":
    sys.exit(main())
