"""The `capstan` command line."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from capstan.commands import (
    admin_commands,
    broker_commands,
    client_commands,
    cluster_commands,
    controller_commands,
    group_commands,
    operator_commands,
    output,
    parent_death,
    spark_commands,
    store_commands,
    user_commands,
)

BENCHMARKS = ("store", "broker", "consumer", "ha", "failover", "fifo", "spark")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capstan", description="Capstan message queue")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    commands = parser.add_subparsers(dest="command", required=True)

    bench = commands.add_parser("bench", help="run a benchmark; its last line is JSON")
    bench.add_argument("name", choices=BENCHMARKS)
    bench.add_argument("--quick", action="store_true", help="a smaller run, under a minute")
    bench.add_argument(
        "--secure",
        action="store_true",
        help="broker only: the figures with TLS and authentication on, as ratios to plaintext",
    )
    bench.add_argument(
        "--dir", default=None, help="where to put the benchmark's files (default: temp)"
    )

    broker_commands.add_parsers(commands)
    controller_commands.add_parsers(commands)
    cluster_commands.add_parsers(commands)
    admin_commands.add_topic_parsers(commands)
    group_commands.add_parsers(commands)
    user_commands.add_parsers(commands)
    admin_commands.add_message_parsers(commands)
    client_commands.add_parsers(commands)
    operator_commands.add_parsers(commands)

    store_commands.add_parsers(commands)
    spark_commands.add_parsers(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    orphaned = parent_death.follow_supervisor()  # first: `capstan up` may die any time
    if orphaned is not None:
        print(f"error: {orphaned}", file=sys.stderr)
        return 1
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "bench":
        bench = importlib.import_module(f"capstan.bench.{args.name}_bench")
        extra = {"secure": True} if args.secure else {}
        if args.secure and args.name != "broker":
            print("error: --secure is for `capstan bench broker`", file=sys.stderr)
            return 2
        bench.main(quick=args.quick, directory=args.dir, **extra)
        return 0
    run = getattr(args, "run", None)
    if run is not None:
        return output.run_guarded(run, args)
    return 2


def _main_entry() -> None:
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. `capstan consume … | head`
        sys.stderr.close()
        sys.exit(0)


if __name__ == "__main__":
    _main_entry()
