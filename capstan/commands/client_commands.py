"""`capstan produce` and `capstan consume`: send and receive through the SDK's producer and
simple consumer (client/), as any application would: the topic's route from `--server`
(the controller or a broker), then the broker groups it names, going round a group's
replicas while its master is replaced (for up to `FAILOVER_WINDOW_S`)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from capstan.client.consumer.simple_consumer import PoppedMessage, SimpleConsumer
from capstan.client.errors import ClientError
from capstan.client.message import Message, SendReceipt
from capstan.client.producer.producer import Producer
from capstan.commands import reach
from capstan.commands.output import CommandError, json_flag, print_json
from capstan.commands.reach import add_server

FAILOVER_WINDOW_S = 30.0
"""How long a send or receive keeps going round a group's replicas while none serves (a
master's death, until the next is elected: seconds), in seconds."""

SEND_TIMEOUT_S = 10.0

_ROUTED = (
    "the controller or a broker, asked for the topic's route; messages then go to the "
    "broker groups the route names"
)
_POLL_ONE_GROUP_S = 20.0
_POLL_EACH_OF_SEVERAL_S = 2.0

T = TypeVar("T")


class _SayWaiting(logging.Handler):
    """Says once on stderr that a send or receive is waiting for a broker group (the SDK
    notes each retry at INFO), and passes the SDK's warnings on as they are."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self._said = False

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            print(f"warning: {record.getMessage()}", file=sys.stderr, flush=True)
        elif not self._said:
            self._said = True
            print(f"waiting: {record.getMessage()}", file=sys.stderr, flush=True)


def _show_waiting() -> None:
    """Route the SDK's log through `_SayWaiting` for this command (unless --log-level asked
    for its INFO lines)."""
    sdk = logging.getLogger("capstan.client")
    if sdk.getEffectiveLevel() <= logging.INFO:
        return
    sdk.setLevel(logging.INFO)
    sdk.propagate = False
    sdk.addHandler(_SayWaiting())


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("produce", help="send messages (the body, or one per stdin line)")
    p.add_argument("topic")
    p.add_argument("--body", help="message body; without it, each line of stdin is one message")
    p.add_argument("--count", type=int, default=1, help="send --body this many times")
    p.add_argument("--tag")
    p.add_argument("--key", action="append", default=[], help="a message key (repeatable)")
    p.add_argument("--message-group", help="FIFO message group")
    p.add_argument("--delay-s", type=float, default=None, help="deliver after this many seconds")
    p.add_argument("--property", action="append", default=[], help="NAME=VALUE (repeatable)")
    add_server(p, _ROUTED)
    json_flag(p)
    p.set_defaults(run=_produce)

    c = commands.add_parser("consume", help="receive and acknowledge messages of a group")
    c.add_argument("topic")
    c.add_argument("--group", required=True)
    c.add_argument("--count", type=int, default=0, help="stop after this many (0: until idle)")
    c.add_argument("--tag-filter", default="*", help="tag expression: * or a||b")
    c.add_argument("--wait-s", type=float, default=5.0, help="stop after this long with nothing")
    c.add_argument("--invisible-s", type=int, default=30, help="invisible time per receive")
    c.add_argument("--no-ack", action="store_true", help="do not acknowledge (they come back)")
    add_server(c, _ROUTED)
    json_flag(c)
    c.set_defaults(run=_consume)


def _route(args: argparse.Namespace, command: str, lookup: Callable[[], T]) -> T:
    """`lookup()` of the topic's route, retried while `--server` starts; a refusal names
    the topic."""

    def run() -> T:
        try:
            return lookup()
        except ClientError as exc:
            if exc.code in ("UNAVAILABLE", "UNIMPLEMENTED"):
                raise  # reach.call retries it, or says what answers at --server
            raise CommandError(f"route of topic {args.topic}: {exc.code}: {exc.detail}") from None

    return reach.call(args.server, reach.messaging_need(command), run)


# -- produce --------------------------------------------------------------------------------


def _bodies(args: argparse.Namespace) -> Iterator[bytes]:
    if args.body is not None:
        for _ in range(max(args.count, 0)):
            yield args.body.encode()
        return
    for line in sys.stdin:
        line = line.rstrip("\n")
        if line:
            yield line.encode()


def _properties(args: argparse.Namespace) -> dict[str, str]:
    props: dict[str, str] = {}
    for item in args.property:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CommandError(f"--property {item!r}: expected NAME=VALUE")
        props[name] = value
    return props


def _message(args: argparse.Namespace, props: dict[str, str], body: bytes) -> Message:
    deliver_at = None
    if args.delay_s is not None:
        deliver_at = int((time.time() + args.delay_s) * 1000)
    try:
        return Message(
            args.topic,
            body,
            tag=args.tag,
            keys=list(args.key),
            properties=dict(props),
            message_group=args.message_group,
            delivery_timestamp_ms=deliver_at,
        )
    except (ValueError, TypeError) as exc:
        raise CommandError(str(exc)) from None


def _sent_row(receipt: SendReceipt) -> dict[str, Any]:
    return {
        "message_id": receipt.message_id,
        "broker": receipt.broker_name,
        "queue_id": receipt.queue_id,
        "queue_offset": receipt.offset,
    }


def _produce(args: argparse.Namespace) -> int:
    _show_waiting()
    props = _properties(args)
    producer = Producer(
        args.server,
        credentials=reach.credentials(args),
        ca_file=reach.ca_file(args),
        send_timeout_s=SEND_TIMEOUT_S,
        retry_window_s=FAILOVER_WINDOW_S,
        route_refresh_s=FAILOVER_WINDOW_S,
    )
    sent: list[dict[str, Any]] = []
    try:
        producer.start()
        if not _route(args, "produce", lambda: producer.routes.write_queues(args.topic)):
            raise CommandError(f"topic {args.topic} has no writable queue now")
        for body in _bodies(args):
            try:
                receipt = producer.send(_message(args, props, body))
            except ClientError as exc:
                raise CommandError(f"send failed: {exc}") from None
            sent.append(_sent_row(receipt))
            if not args.json:
                print(
                    f"sent {receipt.message_id} to queue {receipt.queue_id} at offset "
                    f"{receipt.offset} ({receipt.broker_name})",
                    flush=True,
                )
    except CommandError as exc:
        _report(args, "messages", sent, error=str(exc))
        raise
    finally:
        producer.shutdown()
    _report(args, "messages", sent)
    if not args.json:
        print(f"{len(sent)} message(s) sent to {args.topic}", file=sys.stderr)
    return 0


def _report(
    args: argparse.Namespace, key: str, rows: list[dict[str, Any]], error: str = ""
) -> None:
    """The one JSON object of --json (with what was done before an error, if any)."""
    if not args.json:
        return
    document: dict[str, Any] = {"topic": args.topic}
    if getattr(args, "group", None):
        document["group"] = args.group
    document[key] = rows
    if error:
        document["error"] = error
    print_json(document)


# -- consume --------------------------------------------------------------------------------


def _consume(args: argparse.Namespace) -> int:
    _show_waiting()
    consumer = SimpleConsumer(
        args.server,
        args.group,
        args.topic,
        credentials=reach.credentials(args),
        ca_file=reach.ca_file(args),
        tag_expression=args.tag_filter,
        retry_window_s=FAILOVER_WINDOW_S,
        route_refresh_s=FAILOVER_WINDOW_S,
    )
    received: list[dict[str, Any]] = []
    try:
        consumer.start()
        groups = _route(args, "consume", consumer.broker_groups)
        if not groups:
            raise CommandError(f"topic {args.topic} has no readable queue now")
        _consume_into(received, consumer, len(groups), args)
    except CommandError as exc:
        _report(args, "messages", received, error=str(exc))
        raise
    finally:
        consumer.shutdown()
    _report(args, "messages", received)
    if not args.json:
        print(f"{len(received)} message(s) received from {args.topic}", file=sys.stderr)
    return 0


def _consume_into(
    received: list[dict[str, Any]], consumer: SimpleConsumer, groups: int, args: argparse.Namespace
) -> None:
    """Receive from each broker group in turn until --count or --wait-s idle."""
    poll_s = _POLL_ONE_GROUP_S if groups == 1 else _POLL_EACH_OF_SEVERAL_S
    idle_since = time.monotonic()
    while True:
        left = args.wait_s - (time.monotonic() - idle_since)
        if left <= 0 or 0 < args.count <= len(received):
            return
        want = args.count - len(received) if args.count > 0 else 32
        try:
            messages = consumer.receive(min(32, want), args.invisible_s, min(left, poll_s))
        except ClientError as exc:
            raise CommandError(f"receive failed: {exc}") from None
        if messages:
            idle_since = time.monotonic()
        for m in messages:
            received.append(_row(m))
            if not args.json:
                _print_message(m)
            if not args.no_ack:
                try:
                    consumer.ack(m)
                except ClientError as exc:
                    raise CommandError(f"ack failed: {exc}") from None


def _row(m: PoppedMessage) -> dict[str, Any]:
    view = m.message
    return {
        "message_id": view.message_id,
        "topic": view.topic,
        "broker": m.broker_name,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "tag": view.tag,
        "keys": list(view.keys),
        "message_group": view.message_group,
        "delivery_attempt": m.delivery_attempt,
        "properties": dict(view.properties),
        "body": view.body.decode("utf-8", errors="replace"),
    }


def _print_message(m: PoppedMessage) -> None:
    body = m.message.body.decode("utf-8", errors="replace")
    print(
        f"{m.message.message_id} {m.broker_name} queue {m.queue_id}@{m.queue_offset} attempt "
        f"{m.delivery_attempt}: {body}",
        flush=True,
    )
