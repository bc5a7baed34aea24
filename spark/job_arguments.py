"""The command-line arguments of the Spark jobs, shared by `capstan spark ...` and the
jobs' spark-submit entry points (compaction.main, audit.main). Imports no PySpark, so the
`capstan` command starts fast and works without the spark extra."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

TOMBSTONE_RETENTION_ATTRIBUTE = "delete.retention.ms"
TOMBSTONE_PROPERTY = "tombstone"


def add_target(parser: argparse.ArgumentParser, default_controller: str | None) -> None:
    """--controller or --brokers: the cluster the job works on; --status-of: the resource
    whose status gets the job's result."""
    parser.add_argument(
        "--status-of",
        metavar="PLURAL/NAMESPACE/NAME",
        help="write the result into this resource's status (topics/NS/NAME for a "
        "compaction, brokergroups/NS/NAME for an audit), as scheduled jobs do",
    )
    where = parser.add_mutually_exclusive_group()
    suffix = f" (default {default_controller})" if default_controller else ""
    where.add_argument(
        "--controller",
        default=None,
        help=f"host:port of the controller, the clients' endpoint{suffix}",
    )
    where.add_argument("--brokers", help="host:port of standalone brokers, comma-separated")


def add_compact_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic", help="a topic whose cleanup policy is compact")
    parser.add_argument(
        "--tombstone-retention-ms",
        type=int,
        default=None,
        help=f"drop a key whose latest record is a tombstone (user property "
        f"{TOMBSTONE_PROPERTY}=true) older than this (default: the topic's "
        f"{TOMBSTONE_RETENTION_ATTRIBUTE} attribute, else 24 hours)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        help="audit only this topic (repeatable; default: every user topic and the groups' "
        "retry and dead-letter topics)",
    )
    parser.add_argument(
        "--report-dir",
        type=Path,
        help="write audit.json, audit.html and audit.prom (Prometheus text format) here",
    )
    parser.add_argument(
        "--pushgateway", help="push the metrics to this Prometheus Pushgateway (host:port)"
    )
    parser.add_argument("--cluster", default="capstan", help="the cluster label of pushed metrics")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def parse_job_arguments(
    prog: str,
    description: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    argv: list[str] | None,
) -> argparse.Namespace:
    """A job's spark-submit arguments: its own, with --controller or --brokers required."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_target(parser, None)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if not args.controller and not args.brokers:
        parser.error("give --controller or --brokers")
    return args


def targets(args: argparse.Namespace) -> tuple[str, tuple[str, ...]]:
    """(controller, brokers) from parsed arguments."""
    return args.controller or "", tuple(b for b in (args.brokers or "").split(",") if b)
