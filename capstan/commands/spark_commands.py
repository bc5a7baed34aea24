"""`capstan spark compact`: the PySpark jobs of spark/ run in local mode
(`local[*]`) against a cluster, by default `capstan up`'s. On Kubernetes the same jobs run
with spark-submit or as a SparkApplication (docs/spark.md)."""

from __future__ import annotations

import argparse

from capstan.commands.output import CommandError
from capstan.commands.reach import DEFAULT_SERVER
from capstan.spark.job_arguments import add_compact_arguments, add_target


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    spark = commands.add_parser("spark", help="run a PySpark job (compaction) locally")
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


def _job_arguments(parser: argparse.ArgumentParser) -> None:
    add_target(parser, DEFAULT_SERVER)
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")


def _run_compact(args: argparse.Namespace) -> int:
    _need_pyspark()
    from capstan.spark import compaction

    _default_target(args)
    return compaction.run(args, master=args.master)


def _default_target(args: argparse.Namespace) -> None:
    if not args.controller and not args.brokers:
        args.controller = DEFAULT_SERVER


def _need_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise CommandError(
            f"PySpark is not installed ({exc}); install the spark extra: "
            "pip install 'capstan[spark]'"
        ) from None
