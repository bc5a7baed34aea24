"""The e2e story's traffic: the official RocketMQ 5 Python client (rocketmq-python-client)
sending or receiving until told to stop, writing one line per event, so the story can tell
afterwards what was acknowledged, what failed and what arrived.

    python -P traffic.py produce ENDPOINT TOPIC NAME [--fifo] [--keys N] [--count N]
                                 [--rate PER_S] [--sample-every K] [--out FILE] [--stop FILE]
    python -P traffic.py consume ENDPOINT GROUP TOPIC[,TOPIC...] [--out FILE] [--stop FILE]
                                 [--idle-exit SECONDS] [--tag TAG] [--expect-file FILE]

Lines (tab-separated; the clock is CLOCK_MONOTONIC, which host and pods share on one node):
    S <clock> <1 acknowledged | 0 failed> <body> <error or ->      one per send
    R <clock> <topic> <body>                                        one per message received
It runs until the stop file appears or SIGTERM (a pod deleted), a producer with --count
also after that many sends, and a consumer with --idle-exit also once nothing arrived for
that long, with --expect-file also once it has received every body the file lists (one a
line). A producer
sends at most --rate messages a second (each 1 / rate after the one before began, never
catching up after a stall; 0: --pause between sends), and
tags a body `e2e-sample` when `is_sampled` says so (one in --sample-every, by the body's
CRC-32: chosen before any send, spread over every queue), otherwise `e2e`; a consumer with
--tag receives only what carries that tag. Standalone (only the official client),
so a pod of Capstan's image can run it from a ConfigMap.

A secured cluster: CAPSTAN_ACCESS_KEY and CAPSTAN_SECRET_KEY sign every call, and with
GRPC_DEFAULT_SSL_ROOTS_FILE_PATH (the CA gRPC trusts) the client speaks TLS.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
import zlib
from pathlib import Path
from typing import TextIO

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

_stopping = False


def _stop(*_: object) -> None:
    global _stopping
    _stopping = True


def _stopped(stop: Path | None) -> bool:
    return _stopping or (stop is not None and stop.exists())


def _line(out: TextIO, *fields: object) -> None:
    out.write("\t".join(str(f).replace("\t", " ").replace("\n", " ") for f in fields) + "\n")
    out.flush()


def _config(endpoint: str, timeout_s: int) -> ClientConfiguration:
    keys = Credentials(
        os.environ.get("CAPSTAN_ACCESS_KEY", ""), os.environ.get("CAPSTAN_SECRET_KEY", "")
    )
    return ClientConfiguration(endpoint, keys, request_timeout=timeout_s)


TLS = bool(os.environ.get("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"))
SAMPLE_TAG, OTHER_TAG = "e2e-sample", "e2e"


def is_sampled(body: str, every: int) -> bool:
    """Whether `body` is in the sample the official client reads back: one body in
    `every`, by its CRC-32 (not its sequence number, which follows the queues round and
    would put the whole sample in one queue)."""
    return every > 0 and zlib.crc32(body.encode()) % every == 0


def produce(args: argparse.Namespace, out: TextIO) -> None:
    producer = Producer(_config(args.endpoint, 3), (args.topic,), tls_enable=TLS)
    producer.startup()
    n = 0
    due = time.monotonic()
    try:
        while not _stopped(args.stop) and (not args.count or n < args.count):
            if args.rate > 0:  # 1 / rate after the last send began; no burst after a stall
                time.sleep(max(0.0, due - time.monotonic()))
                due = max(due, time.monotonic()) + 1 / args.rate
            body = f"{args.name}-{n}"
            message = Message()
            message.topic = args.topic
            message.body = body.encode()
            message.tag = SAMPLE_TAG if is_sampled(body, args.sample_every) else OTHER_TAG
            if args.fifo:
                message.message_group = f"{args.name}-{n % 4}"
            if args.keys:
                message.keys = f"{args.name}-key-{n % args.keys}"
            n += 1
            try:
                producer.send(message)
                _line(out, "S", time.monotonic(), 1, body, "-")
            except Exception as e:  # noqa: BLE001 - the client raises its own error types
                _line(out, "S", time.monotonic(), 0, body, f"{type(e).__name__}: {e}"[:200])
                time.sleep(0.2)
            if args.rate <= 0:
                time.sleep(args.pause)
    finally:
        producer.shutdown()


def consume(args: argparse.Namespace, out: TextIO) -> None:
    topics = args.topics.split(",")
    consumer = SimpleConsumer(
        _config(args.endpoint, 5),
        args.group,
        {t: FilterExpression(args.tag) for t in topics},
        await_duration=3,
        tls_enable=TLS,
    )
    consumer.startup()
    last = time.monotonic()
    awaited = set(args.expect_file.read_text().split("\n")) - {""} if args.expect_file else None
    try:
        while not _stopped(args.stop):
            if args.idle_exit and time.monotonic() - last > args.idle_exit:
                break
            if awaited is not None and not awaited:
                break
            try:
                messages = consumer.receive(16, 20)
            except Exception:  # noqa: BLE001 - a failover in progress: try again
                time.sleep(0.5)
                continue
            for m in messages or []:
                last = time.monotonic()
                body = m.body.decode(errors="replace")
                if awaited is not None:
                    awaited.discard(body)
                _line(out, "R", last, m.topic, body)
                try:
                    consumer.ack(m)
                except Exception:  # noqa: BLE001 - it comes again: counted as a duplicate
                    pass
    finally:
        consumer.shutdown()


def _stop_with_parent() -> None:
    """SIGTERM when the process that started this one dies (Linux's PR_SET_PDEATHSIG), so a
    story killed midway leaves no client sending into the next run's cluster."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the stop file and SIGTERM still end it
    if os.getppid() == 1:  # the parent died before the call
        _stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("produce")
    p.add_argument("endpoint")
    p.add_argument("topic")
    p.add_argument("name")
    p.add_argument("--fifo", action="store_true")
    p.add_argument("--pause", type=float, default=0.05, help="between sends, without --rate")
    p.add_argument("--rate", type=float, default=0.0, help="sends a second at most (0: no pace)")
    p.add_argument("--sample-every", type=int, default=0, help="tag one body in K as sampled")
    p.add_argument("--keys", type=int, default=0, help="key the messages, N distinct keys")
    p.add_argument("--count", type=int, default=0, help="stop after N sends (0: never)")
    c = sub.add_parser("consume")
    c.add_argument("endpoint")
    c.add_argument("group")
    c.add_argument("topics")
    c.add_argument("--idle-exit", type=float, default=0.0)
    c.add_argument("--tag", default="*", help="receive only messages with this tag")
    c.add_argument("--expect-file", type=Path, help="end once every body it lists came")
    for each in (p, c):
        each.add_argument("--out", type=Path)
        each.add_argument("--stop", type=Path)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    _stop_with_parent()
    out = args.out.open("a") if args.out else sys.stdout
    try:
        (produce if args.mode == "produce" else consume)(args, out)
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
