"""The `capstan` command line."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import pathlib
import sys
from collections.abc import Sequence

from capstan.commands import (
    admin_commands,
    broker_commands,
    client_commands,
    cluster_commands,
    controller_commands,
)

BENCHMARKS = ("store", "broker", "consumer", "ha", "fifo")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capstan", description="Capstan message queue")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    commands = parser.add_subparsers(dest="command", required=True)

    bench = commands.add_parser("bench", help="run a benchmark; its last line is JSON")
    bench.add_argument("name", choices=BENCHMARKS)
    bench.add_argument("--quick", action="store_true", help="a smaller run, under a minute")
    bench.add_argument(
        "--dir", default=None, help="where to put the benchmark's files (default: temp)"
    )

    broker_commands.add_parsers(commands)
    controller_commands.add_parsers(commands)
    cluster_commands.add_parsers(commands)
    admin_commands.add_parsers(commands)
    client_commands.add_parsers(commands)

    store = commands.add_parser("store", help="inspect a broker's store on disk")
    store_commands = store.add_subparsers(dest="store_command", required=True)
    check = store_commands.add_parser("check", help="open a store, run recovery, report, close")
    check.add_argument("--data-dir", required=True, help="the store's directory")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    queues = store_commands.add_parser("queues", help="list consume queues with min/max offsets")
    queues.add_argument("--data-dir", required=True, help="the store's directory")
    queues.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "bench":
        bench = importlib.import_module(f"capstan.bench.{args.name}_bench")
        bench.main(quick=args.quick, directory=args.dir)
        return 0
    if args.command == "store":
        return _store_command(args)
    run = getattr(args, "run", None)
    if run is not None:
        return admin_commands.run_guarded(run, args)
    return 2


def _store_command(args: argparse.Namespace) -> int:
    from capstan.broker.store.message_store import MessageStore
    from capstan.common.errors import CapstanError

    root = pathlib.Path(args.data_dir)
    if not (root / "commitlog").is_dir():
        print(f"error: {root} holds no Capstan store (no commitlog/ folder)", file=sys.stderr)
        return 1
    try:
        store = MessageStore(root)
    except CapstanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    with store:
        if args.store_command == "check":
            report = store.recovery
            if args.json:
                print(
                    json.dumps(
                        {k: v for k, v in vars(report).items() if k != "checkpoint"}, default=str
                    )
                )
            else:
                print(report.summary())
        else:
            rows = [
                {"topic": q.topic, "queue": q.queue_id, "min": q.min_offset, "max": q.max_offset}
                for q in sorted(store.queues, key=lambda q: (q.topic, q.queue_id))
            ]
            if args.json:
                print(json.dumps(rows))
            else:
                print(f"{'TOPIC':30} {'QUEUE':>5} {'MIN':>12} {'MAX':>12}")
                for r in rows:
                    print(f"{r['topic']:30} {r['queue']:>5} {r['min']:>12} {r['max']:>12}")
    return 0


def _main_entry() -> None:
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. `capstan consume … | head`
        sys.stderr.close()
        sys.exit(0)


if __name__ == "__main__":
    _main_entry()
