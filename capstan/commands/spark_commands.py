"""`capstan spark compact|audit`: the PySpark jobs of spark/ run in local mode
(`local[*]`) against a cluster, by default `capstan up`'s. On Kubernetes the same jobs run
with spark-submit or as a SparkApplication (docs/spark.md)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from capstan.commands.output import CommandError
from capstan.commands.reach import DEFAULT_SERVER
from capstan.spark.job_arguments import add_audit_arguments, add_compact_arguments, add_target


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    spark = commands.add_parser("spark", help="run a PySpark job (compaction, audit) locally")
    sub = spark.add_subparsers(dest="spark_command", required=True)
    compact = sub.add_parser(
        "compact",
        help="keep the latest record per key of a compact topic on every broker group",
        description="Read the topic below each queue's current end, keep the latest record "
        "of each key (dropping expired tombstones: the user property tombstone=true), and "
        "swap the compacted copy in on every live replica. Exit status 1 if a group or "
        "replica was not compacted.",
    )
    add_compact_arguments(compact)
    _job_arguments(compact)
    compact.set_defaults(run=_run_compact)
    audit = sub.add_parser(
        "audit",
        help="check committed offsets and every replica's data; exit 1 on a problem",
        description="Per consumer group, topic and queue: committed offset against the "
        "queue's bounds, lag and its age, retry and dead-letter counts; per replica: "
        "unreadable records, CRC failures, gaps, and replicas that differ. Exit status 1 "
        "when a correctness problem is found, 2 when the audit could not run.",
    )
    add_audit_arguments(audit)
    _job_arguments(audit)
    audit.set_defaults(run=_run_audit)


def _job_arguments(parser: argparse.ArgumentParser) -> None:
    add_target(parser, DEFAULT_SERVER)
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show Spark's own output (log4j, warnings) here; without it, it goes to a file "
        "whose path is printed",
    )


def _run_compact(args: argparse.Namespace) -> int:
    _need_pyspark()
    from capstan.spark import compaction

    _default_target(args)
    _spark_log(args, "compact")
    return compaction.run(args, master=args.master)


def _run_audit(args: argparse.Namespace) -> int:
    _need_pyspark()
    from capstan.spark import audit

    _default_target(args)
    _spark_log(args, "audit")
    return audit.run(args, master=args.master)


def _default_target(args: argparse.Namespace) -> None:
    if not (args.server or args.controller or args.brokers):
        args.server = DEFAULT_SERVER


def _spark_log(args: argparse.Namespace, job: str) -> None:
    """Unless --verbose: the file Spark's own output goes to, named on stderr."""
    if args.verbose:
        args.spark_log = None
        return
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.spark_log = Path(tempfile.gettempdir()) / f"capstan-spark-{job}-{stamp}-{os.getpid()}.log"
    print(f"Spark's own output: {args.spark_log} (--verbose shows it here)", file=sys.stderr)


def _need_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise CommandError(
            f"PySpark is not installed ({exc}); install the spark extra: "
            "pip install 'capstan[spark]'"
        ) from None
