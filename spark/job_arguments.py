"""The command-line arguments of the Spark jobs, shared by `capstan spark ...` and the
jobs' spark-submit entry points (compaction.main, audit.main). Imports no PySpark, so the
`capstan` command starts fast and works without the spark extra."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

TOMBSTONE_RETENTION_ATTRIBUTE = "delete.retention.ms"
TOMBSTONE_PROPERTY = "tombstone"


def add_target(parser: argparse.ArgumentParser, default_server: str | None) -> None:
    """--server: the cluster the job works on; --status-of: the resource whose status gets
    the job's result."""
    parser.add_argument(
        "--status-of",
        metavar="PLURAL/NAMESPACE/NAME",
        help="write the result into this resource's status (topics/NS/NAME for a "
        "compaction, brokergroups/NS/NAME for an audit), as scheduled jobs do",
    )
    where = parser.add_mutually_exclusive_group()
    suffix = f" (default {default_server})" if default_server else ""
    where.add_argument(
        "--server",
        default=None,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the controller, the clients' endpoint; or standalone brokers, comma-separated"
        + suffix,
    )
    # The names before --server, kept so that jobs scheduled by older releases still run.
    where.add_argument("--controller", default=None, help=argparse.SUPPRESS)
    where.add_argument("--brokers", default=None, help=argparse.SUPPRESS)


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
    """A job's spark-submit arguments: its own, with --server required."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_target(parser, None)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if not (args.server or args.controller or args.brokers):
        parser.error("give --server HOST:PORT (the controller, or standalone brokers)")
    return args


def targets(args: argparse.Namespace) -> tuple[str, tuple[str, ...]]:
    """(controller, brokers) from parsed arguments. --server addresses that serve the
    Controller service are the controller's replicas (comma-separated in the first: every
    call finds the leader among them); addresses that do not are standalone brokers."""
    if args.controller or args.brokers:
        return args.controller or "", _addresses(args.brokers)
    servers = _addresses(args.server)
    if _serve_controller(servers):
        return ",".join(servers), ()
    return "", servers


def controller_addresses(controller: str) -> list[str]:
    """The controller replicas a `controller` target names (comma-separated)."""
    return list(_addresses(controller))


def _addresses(text: str | None) -> tuple[str, ...]:
    return tuple(a.strip() for a in (text or "").split(",") if a.strip())


def _serve_controller(servers: tuple[str, ...]) -> bool:
    """Whether `servers` are controller replicas: the first that answers says so (a leader
    answers, a follower refuses with FAILED_PRECONDITION, a broker does not know the
    service). None reached counts as controllers, so the job's first call says so."""
    from capstan.client.admin import BlockingControllerClient
    from capstan.client.errors import ClientError
    from capstan.security.credentials import client_access

    for address in servers:
        with BlockingControllerClient(
            address, timeout_s=10, retry_s=0, **client_access()
        ) as controller:
            try:
                controller.cluster_status()
            except ClientError as exc:
                if exc.code == "UNAVAILABLE":
                    continue
                return exc.code != "UNIMPLEMENTED"
        return True
    return True
