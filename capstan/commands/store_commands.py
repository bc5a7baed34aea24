"""`capstan store check|queues`: a broker's store on disk, opened (with recovery) and
closed again; the broker must not be running on it."""

from __future__ import annotations

import argparse
import pathlib
from typing import TYPE_CHECKING

from capstan.commands.output import CommandError, json_flag, print_json

if TYPE_CHECKING:
    from capstan.broker.store.message_store import MessageStore


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    store = commands.add_parser("store", help="inspect a broker's store on disk")
    sub = store.add_subparsers(dest="store_command", required=True)
    check = sub.add_parser("check", help="open a store, run recovery, report, close")
    check.add_argument("--data-dir", required=True, help="the store's directory")
    json_flag(check)
    check.set_defaults(run=_run)
    queues = sub.add_parser("queues", help="list consume queues with min/max offsets")
    queues.add_argument("--data-dir", required=True, help="the store's directory")
    json_flag(queues)
    queues.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    # Imported here: only these commands load the store.
    from capstan.broker.store.message_store import MessageStore
    from capstan.common.errors import CapstanError

    root = pathlib.Path(args.data_dir)
    if not (root / "commitlog").is_dir():
        raise CommandError(f"{root} holds no Capstan store (no commitlog/ folder)")
    try:
        store = MessageStore(root)
    except CapstanError as exc:
        raise CommandError(str(exc)) from None
    with store:
        if args.store_command == "check":
            _check(store, args.json)
        else:
            _queues(store, args.json)
    return 0


def _check(store: MessageStore, as_json: bool) -> None:
    report = store.recovery
    if as_json:
        print_json({k: v for k, v in vars(report).items() if k != "checkpoint"})
    else:
        print(report.summary())


def _queues(store: MessageStore, as_json: bool) -> None:
    rows = [
        {
            "topic": q.topic,
            "queue_id": q.queue_id,
            "min_offset": q.min_offset,
            "max_offset": q.max_offset,
        }
        for q in sorted(store.queues, key=lambda q: (q.topic, q.queue_id))
    ]
    if as_json:
        print_json({"queues": rows})
        return
    print(f"{'TOPIC':30} {'QUEUE':>5} {'MIN':>12} {'MAX':>12}")
    for r in rows:
        print(f"{r['topic']:30} {r['queue_id']:>5} {r['min_offset']:>12} {r['max_offset']:>12}")
