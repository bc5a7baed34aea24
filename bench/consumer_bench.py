"""`capstan bench consumer [--quick]`: the SDK's PushConsumer against one broker.

1. Push consume: a topic of 8 queues is filled with 1 KiB messages, then a PushConsumer
   with a no-op listener consumes them all (concurrently, 20 threads), once with RocketMQ's
   default batch of 1 message per listener call and once with 32. The peer, in the same
   run: bare pulls of the same API (capstan.v1 PullMessages, 32 per call, every queue at
   once) doing nothing with what they read: what a Python client can read at all.
2. Rebalance takeover: two member processes share the queues while a producer sends
   steadily; one is killed with -9, and the time until the survivor consumes a message
   from a queue the dead one owned is printed.

The last line is JSON with `push_consume_msgs_per_s` and `rebalance_takeover_s`.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from capstan.bench.broker_bench import BATCH_TOPIC, BrokerProcess, _wait_serving, produce_batched
from capstan.client.admin import BlockingAdminClient
from capstan.common.signal_stop import SignalStop
from capstan.v1 import (
    admin_pb2,
    consumer_pb2,
    consumer_pb2_grpc,
    pull_pb2,
    pull_pb2_grpc,
)

GROUP = "bench-push"
QUEUES = 8
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Sizes:
    messages: int
    takeover_rounds: int


QUICK = Sizes(messages=64_000, takeover_rounds=1)
FULL = Sizes(messages=320_000, takeover_rounds=3)


def _create(address: str, topic: str, groups: Sequence[str]) -> None:
    with BlockingAdminClient(address, timeout_s=TIMEOUT_S) as admin:
        admin.create_topic(
            admin_pb2.Topic(
                name=topic, type=admin_pb2.NORMAL, read_queue_nums=QUEUES, write_queue_nums=QUEUES
            )
        )
        for group in groups:
            admin.create_group(admin_pb2.Group(name=group))


async def _fill(address: str, total: int) -> None:
    from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        await _wait_serving(channel)
        await produce_batched(svc_grpc.MessagingServiceStub(channel), total)


# -- push consume ------------------------------------------------------------------------


def push_consume(address: str, total: int, group: str, batch: int) -> float:
    """Messages per second a PushConsumer with a no-op listener consumes."""
    from capstan.client.consumer.push_consumer import PushConsumer
    from capstan.client.consumer.settings import (
        ConsumeFromWhere,
        ConsumerOptions,
        ConsumeStatus,
    )

    count = 0
    lock = threading.Lock()
    done = threading.Event()
    first_at: list[float] = []

    def listener(messages: Sequence[object], _context: object) -> ConsumeStatus:
        nonlocal count
        with lock:
            if not first_at:
                first_at.append(time.perf_counter())
            count += len(messages)
            if count >= total:
                done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    options = ConsumerOptions(
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET, consume_message_batch_max_size=batch
    )
    consumer = PushConsumer(address, group, listener, options=options)
    consumer.subscribe(BATCH_TOPIC)
    consumer.start()
    try:
        if not done.wait(300):
            raise RuntimeError(f"the PushConsumer consumed {count} of {total} in 300 s")
        elapsed = time.perf_counter() - first_at[0]
    finally:
        consumer.shutdown()
    return total / elapsed


def bare_pull(address: str, total: int, group: str) -> float:
    """The peer: PullMessages (32 per call) on every queue at once, round after round,
    with nothing done with the messages."""
    stub = pull_pb2_grpc.PullStub(grpc.insecure_channel(address))  # type: ignore[no-untyped-call]
    offsets = [0] * QUEUES
    count = 0
    start = time.perf_counter()
    while count < total:
        futures = [
            stub.PullMessages.future(
                pull_pb2.PullMessagesRequest(
                    group=group,
                    topic=BATCH_TOPIC,
                    queue_id=qid,
                    offset=offsets[qid],
                    max_messages=32,
                ),
                timeout=TIMEOUT_S,
            )
            for qid in range(QUEUES)
        ]
        for qid, future in enumerate(futures):
            reply = future.result()
            count += len(reply.messages)
            offsets[qid] = reply.next_begin_offset
    return total / (time.perf_counter() - start)


# -- takeover ---------------------------------------------------------------------------


def member_main(address: str, group: str, topic: str, out_path: str) -> None:
    """A member process: consume `topic`, writing "queue_id unix_time" per message."""
    from capstan.client.consumer.push_consumer import PushConsumer
    from capstan.client.consumer.settings import ConsumerOptions, ConsumeStatus

    out = open(out_path, "a", buffering=1)  # noqa: SIM115 - for the life of the process
    lock = threading.Lock()

    def listener(messages: Sequence[object], _context: object) -> ConsumeStatus:
        with lock:
            for m in messages:
                out.write(f"{m.queue_id} {time.time()}\n")  # type: ignore[attr-defined]
        return ConsumeStatus.CONSUME_SUCCESS

    options = ConsumerOptions(heartbeat_interval_s=1.0)
    consumer = PushConsumer(address, group, listener, options=options)
    consumer.subscribe(topic)
    stop = SignalStop()
    stop.install([signal.SIGTERM])
    consumer.start()
    stop.wait()
    consumer.shutdown()


def _owned(address: str, group: str, topic: str) -> dict[str, list[int]]:
    stub = consumer_pb2_grpc.ConsumerStub(grpc.insecure_channel(address))  # type: ignore[no-untyped-call]
    members = stub.GetMembers(consumer_pb2.GetMembersRequest(group=group), timeout=TIMEOUT_S)
    return {
        m.client_id: sorted(q.queue_id for q in m.owned if q.topic == topic)
        for m in members.members
    }


def _wait_owned(address: str, group: str, topic: str, members: int) -> dict[str, list[int]]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        owned = _owned(address, group, topic)
        queues = sorted(q for qs in owned.values() for q in qs)
        if len(owned) == members and queues == list(range(QUEUES)):
            return owned
        time.sleep(0.05)
    raise RuntimeError(
        f"{members} members never shared the queues: {_owned(address, group, topic)}"
    )


def takeover(root: pathlib.Path, address: str, round_no: int) -> float:
    """Seconds from a member's kill -9 to the survivor consuming one of its queues."""
    from capstan.client.message import Message
    from capstan.client.producer.producer import Producer

    topic, group = f"takeover-{round_no}", f"bench-takeover-{round_no}"
    _create(address, topic, [group])
    outs = [root / f"member-{round_no}-{n}.txt" for n in range(2)]
    env = dict(os.environ, PYTHONSAFEPATH="1")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "capstan.bench.consumer_bench",
                "--member",
                address,
                group,
                topic,
                str(out),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for out in outs
    ]
    stop = threading.Event()

    def produce() -> None:
        with Producer(address) as producer:
            while not stop.is_set():
                producer.send(Message(topic, b"x" * 1024))
                time.sleep(0.005)

    sender = threading.Thread(target=produce, daemon=True)
    try:
        _wait_owned(address, group, topic, 2)
        sender.start()
        time.sleep(1.0)
        owned = _owned(address, group, topic)
        victim_id = sorted(owned)[0]
        victim_queues = set(owned[victim_id])
        # Which process is the victim: the one whose output has its queues.
        victim = next(
            n
            for n, out in enumerate(outs)
            if out.exists()
            and any(int(line.split()[0]) in victim_queues for line in out.read_text().splitlines())
        )
        survivor_out = outs[1 - victim]
        procs[victim].kill()
        killed_at = time.time()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for line in survivor_out.read_text().splitlines():
                qid, at = line.split()
                if int(qid) in victim_queues and float(at) > killed_at:
                    return float(at) - killed_at
            time.sleep(0.05)
        raise RuntimeError("the survivor never took over the dead member's queues")
    finally:
        stop.set()
        sender.join(10)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)


# -- main -------------------------------------------------------------------------------


def main(quick: bool = False, directory: str | None = None) -> None:
    sizes = QUICK if quick else FULL
    root = pathlib.Path(tempfile.mkdtemp(prefix="capstan-consumer-bench-", dir=directory))
    broker = BrokerProcess(root / "broker", "ASYNC_FLUSH")
    figures: dict[str, float | None] = {}
    try:
        address = broker.start()
        groups = [GROUP, f"{GROUP}-32", "bench-bare"]
        asyncio.run(_ready(address))
        _create(address, BATCH_TOPIC, groups)
        print(f"  filling {BATCH_TOPIC} with {sizes.messages} messages of 1 KiB ...", flush=True)
        asyncio.run(_fill(address, sizes.messages))
        print("  running: bare pull loop (the peer) ...", flush=True)
        figures["bare_pull_msgs_per_s"] = bare_pull(address, sizes.messages, "bench-bare")
        print("  running: PushConsumer, batch 1 ...", flush=True)
        figures["push_consume_msgs_per_s"] = push_consume(address, sizes.messages, GROUP, 1)
        print("  running: PushConsumer, batch 32 ...", flush=True)
        figures["push_consume_batch32_msgs_per_s"] = push_consume(
            address, sizes.messages, f"{GROUP}-32", 32
        )
        takeovers = []
        for n in range(sizes.takeover_rounds):
            print(f"  running: takeover after kill -9, round {n + 1} ...", flush=True)
            takeovers.append(takeover(root, address, n))
        figures["rebalance_takeover_s"] = max(takeovers)
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)
    bare = figures["bare_pull_msgs_per_s"] or 1.0
    figures["ratio_push_to_bare_pull"] = (figures["push_consume_msgs_per_s"] or 0) / bare
    figures["ratio_push_batch32_to_bare_pull"] = (
        figures["push_consume_batch32_msgs_per_s"] or 0
    ) / bare
    print()
    print(f"{'figure':44} {'value':>12}")
    for key, value in figures.items():
        print(f"{key:44} {value:>12.2f}" if value is not None else f"{key:44} {'-':>12}")
    rounded = {k: (round(v, 3) if v is not None else None) for k, v in figures.items()}
    print(json.dumps({"benchmark": "consumer", "quick": quick, **rounded}))


async def _ready(address: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        await _wait_serving(channel)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--member":
        member_main(*sys.argv[2:6])
    else:
        main(quick="--quick" in sys.argv)
