"""`capstan bench broker`: a real broker process over gRPC, 1 KiB messages, for both flush
modes, next to NATS JetStream (file storage) doing the same work in the same run.

Figures: produce 64 messages per SendMessage with several calls in flight; produce one
message per call from one sequential client and from several; consume by ReceiveMessage
(batch 32) + AckMessage, by the v2 PullMessage and by capstan.v1 PullMessages (batch 32 per
queue); send latency under paced load. NATS: pipelined publish, one-at-a-time publish, pull
fetch 32 + ack. The gRPC floor (`grpc_floor.py`) answers the same calls storing nothing:
what gRPC, asyncio and protobuf alone allow on this machine with this client.

The client runs in this process and shares the machine with the broker, so every figure
includes a Python client's cost; the table shows the servers' and the client's CPU use.

Prints a table, then one line of JSON with the figures (the last line of output).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.client.admin import AdminClient
from capstan.client.queue_mapping_wire import mapping_to_wire
from capstan.common.queue_mapping import new_mapping
from capstan.security.credentials import write_credentials_file
from capstan.security.local_ca import create_ca
from capstan.security.signature import Credentials, signed_metadata
from capstan.v1 import admin_pb2, pull_pb2, pull_pb2_grpc

BODY = os.urandom(1024)
QUEUES = 8
BATCH = 64
IN_FLIGHT = 8
"""Batched produce: SendMessage calls in flight at once (8 x 64 = 512 messages)."""
SENDERS = 16
"""Unbatched produce, concurrent: clients each sending one message per call, in turn."""
RECEIVERS = 4
CONSUME_BATCH = 32
LATENCY_LOAD = 0.5
"""Latency is measured at this fraction of the concurrent unbatched peak."""
NATS_WINDOW = IN_FLIGHT * BATCH
"""NATS pipelined publish: unacknowledged publishes in flight (as many as capstan's)."""

SERVICE = "apache.rocketmq.v2.MessagingService"
BATCH_TOPIC = "BenchBatch"
STATIC_TOPIC = "BenchStatic"
"""A static topic of QUEUES logic queues on the broker's own group (issue 31): batched
produce and receive, as a ratio to a normal topic measured in the same turns."""
TWIN_TOPIC = "BenchStaticTwin"
"""The normal topic the static one is compared with, in the same turns."""
BROKER_NAME = "bench-broker"
SINGLE_TOPIC = "BenchSingle"
RECEIVE_GROUP = "BenchReceive"
# The static suite's second pass over both topics, in the other order (static_suite).
SECOND_RECEIVE_GROUP = "BenchReceiveAgain"
# The static suite produces this many times its receives' count to each topic.
STATIC_PRODUCE_TIMES = 4
PULL_GROUP = "BenchPull"
FLUSH_MODES = ("ASYNC_FLUSH", "SYNC_FLUSH")
CALL_TIMEOUT_S = 30.0

Stub = Any
"""The v2 and admin stubs are generated without type information."""


@dataclass(frozen=True)
class Sizes:
    batched_messages: int
    """Produced 64 per call, then consumed once by each consume figure."""
    unbatched_s: float
    """How long each one-message-per-call figure sends for."""
    latency_s: float
    """How long the paced latency run lasts."""
    nats_messages: int


QUICK = Sizes(batched_messages=20_480, unbatched_s=2.0, latency_s=2.0, nats_messages=20_480)
FULL = Sizes(batched_messages=204_800, unbatched_s=10.0, latency_s=10.0, nats_messages=204_800)


# -- processes --------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far, from /proc (None where there is none)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stop(
    proc: subprocess.Popen[bytes],
    name: str,
    sig: signal.Signals = signal.SIGTERM,
    timeout_s: float = 30.0,
) -> None:
    if proc.poll() is not None:
        print(f"  warning: {name} had exited by itself, with code {proc.returncode}", flush=True)
        return
    proc.send_signal(sig)
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        print(f"  warning: {name} ignored {sig.name} for {timeout_s:.0f} s; killing it", flush=True)
        proc.kill()
        proc.wait()
        return
    if code != 0:
        print(f"  warning: {name} exited with code {code} after {sig.name}", flush=True)


def _tail(path: pathlib.Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class ServerProcess:
    """A server on 127.0.0.1 that prints `gRPC endpoint: HOST:PORT` once it listens."""

    label = "the server"

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.target = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout_s: float = 60.0) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        command = self.command()
        out, err = self.root / "server.out", self.root / "server.err"
        env = dict(os.environ, PYTHONSAFEPATH="1")
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            self._proc = subprocess.Popen(
                command, stdout=stdout, stderr=stderr, env=env, cwd=self.root
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(r"gRPC endpoint\s*:\s*(\S+)", out.read_text(errors="replace"))
            if found:
                self.target = found.group(1)
                return self.target
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"{self.label} exited with code {self._proc.returncode}:\n{_tail(err)}"
                )
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(
            f"{self.label} did not announce itself in {timeout_s:.0f} s:\n{_tail(err)}"
        )

    def cpu_seconds(self) -> float | None:
        return None if self._proc is None else _cpu_seconds(self._proc.pid)

    def stop(self) -> None:
        if self._proc is not None:
            _stop(self._proc, self.label)


class BrokerProcess(ServerProcess):
    """`capstan broker` on 127.0.0.1, a port of its choosing, and a fresh data dir."""

    label = "the broker"

    def __init__(
        self, root: pathlib.Path, flush_mode: str, security: BenchSecurity | None = None
    ) -> None:
        super().__init__(root)
        self.flush_mode = flush_mode
        self.security = security

    def command(self) -> list[str]:
        config = self.root / "broker.yaml"
        settings = {
            "data_dir": str(self.root / "data"),
            "listen_host": "127.0.0.1",
            "grpc_port": 0,
            "http_port": -1,
            "shutdown_grace_s": 2.0,
            "broker_name": BROKER_NAME,
            "store": {"flush_mode": self.flush_mode},
            **(self.security.settings() if self.security is not None else {}),
        }
        config.write_text(json.dumps(settings, indent=2))  # JSON is YAML
        return [sys.executable, "-m", "capstan.cli", "broker", "--config", str(config)]


class FloorProcess(ServerProcess):
    """The protocol-only peer of `grpc_floor.py`."""

    label = "the gRPC floor peer"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "capstan.bench.grpc_floor"]


# -- measuring --------------------------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    msgs_per_s: float
    cpu_pct: float | None
    """The server's CPU use during the run, in percent of one core."""
    client_cpu_pct: float
    """This process's (the client's) CPU use during the run, in percent of one core."""


async def _measure(
    work: Callable[[], Awaitable[tuple[int, float]]], cpu: Callable[[], float | None]
) -> Rate:
    """Run `work`, which returns (messages, seconds it took by its own clock)."""
    cpu_before, client_before = cpu(), time.process_time()
    wall_start = time.perf_counter()
    count, elapsed = await work()
    wall = max(time.perf_counter() - wall_start, 1e-9)
    cpu_after, client_after = cpu(), time.process_time()
    used = None
    if cpu_before is not None and cpu_after is not None:
        used = 100 * (cpu_after - cpu_before) / wall
    rate = count / elapsed if elapsed > 0 else 0.0
    return Rate(rate, used, 100 * (client_after - client_before) / wall)


def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


def _announce(label: str) -> None:
    print(f"  running: {label} ...", flush=True)


# -- capstan ----------------------------------------------------------------------------


def _ids(prefix: str) -> Iterator[str]:
    n = 0
    while True:
        yield f"{prefix}{n:024X}"
        n += 1


def _message(topic: str, message_id: str) -> pb.Message:
    return pb.Message(
        topic=pb.Resource(name=topic),
        system_properties=pb.SystemProperties(message_id=message_id, message_type=pb.NORMAL),
        body=BODY,
    )


def _check(what: str, st: Any, also_fine: tuple[int, ...] = ()) -> None:
    if st.code != pb.OK and st.code not in also_fine:
        raise RuntimeError(f"{what} failed: {pb.Code.Name(st.code)} {st.message}")


async def _wait_serving(channel: grpc.aio.Channel, timeout_s: float = 60.0) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
        if time.monotonic() > deadline:
            raise RuntimeError(f"the broker was not SERVING within {timeout_s:.0f} s")
        await asyncio.sleep(0.1)


async def _prepare(
    address: str, security: BenchSecurity | None = None, static_on: str | None = BROKER_NAME
) -> None:
    """The bench's topics and groups; with `static_on` (a broker group's name), the
    static topic too, every logic queue led by that group."""
    keys = security.admin if security is not None else None
    ca = security.ca if security is not None else None
    async with AdminClient(
        address, timeout_s=CALL_TIMEOUT_S, credentials=keys, ca_file=ca
    ) as admin:
        for topic in (BATCH_TOPIC, SINGLE_TOPIC, TWIN_TOPIC):
            await admin.create_topic(
                admin_pb2.Topic(
                    name=topic,
                    type=admin_pb2.NORMAL,
                    read_queue_nums=QUEUES,
                    write_queue_nums=QUEUES,
                )
            )
        if static_on is not None:
            await _make_static_topic(admin, static_on)
        for group in (RECEIVE_GROUP, SECOND_RECEIVE_GROUP, PULL_GROUP):
            await admin.create_group(admin_pb2.Group(name=group))
        if security is not None:  # the application's own user, as in production
            await admin.create_user(
                admin_pb2.User(
                    username=security.app.access_key,
                    secret_key=security.app.secret_key,
                    policy=[
                        admin_pb2.PolicyEntry(
                            resources=["Topic:*", "Group:*"], actions=["Pub", "Sub"]
                        )
                    ],
                )
            )


async def _make_static_topic(admin: AdminClient, group: str) -> None:
    """The static topic on `group` alone, handed over as the controller would
    (SetQueueMapping): every logic queue led there."""
    static = admin_pb2.Topic(
        name=STATIC_TOPIC,
        type=admin_pb2.NORMAL,
        read_queue_nums=QUEUES,
        write_queue_nums=QUEUES,
    )
    mapping = mapping_to_wire(new_mapping(STATIC_TOPIC, QUEUES, [group]))
    await admin.call(
        "SetQueueMapping",
        admin_pb2.SetQueueMappingRequest(topic=static, mapping=mapping),
        "making the static topic",
    )


async def _send(mq: Stub, request: svc.SendMessageRequest) -> None:
    response = await mq.SendMessage(request, timeout=CALL_TIMEOUT_S)
    _check("SendMessage", response.status)


async def produce_batched(mq: Stub, total: int, topic: str = BATCH_TOPIC) -> tuple[int, float]:
    """`total` messages, 64 per SendMessage, IN_FLIGHT calls at a time."""
    ids = _ids("BATCH" if topic == BATCH_TOPIC else "STATIC")
    requests = [
        svc.SendMessageRequest(messages=[_message(topic, next(ids)) for _ in range(BATCH)])
        for _ in range(total // BATCH)
    ]
    pending = iter(requests)

    async def caller() -> None:
        for request in pending:
            await _send(mq, request)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(IN_FLIGHT)))
    return len(requests) * BATCH, time.perf_counter() - start


async def produce_unbatched(mq: Stub, senders: int, seconds: float, run: str) -> tuple[int, float]:
    """`senders` clients, each sending one message per call and waiting for the answer;
    `run` makes the message ids unique to this run."""
    sent = 0
    start = time.perf_counter()
    deadline = start + seconds

    async def sender(n: int) -> None:
        nonlocal sent
        ids = _ids(f"{run}{n:02d}x")
        while time.perf_counter() < deadline:
            await _send(mq, svc.SendMessageRequest(messages=[_message(SINGLE_TOPIC, next(ids))]))
            sent += 1

    await asyncio.gather(*(sender(n) for n in range(senders)))
    return sent, time.perf_counter() - start


@dataclass(frozen=True)
class Latencies:
    ms: list[float]
    """Each successful call's latency in milliseconds, sorted."""
    reached: float
    """Calls issued per second."""
    errors: dict[str, int]
    """Failed calls by gRPC code or v2 status."""


async def paced_latency(mq: Stub, rate: float, seconds: float) -> Latencies:
    """Send one message per call at `rate` calls/s, without waiting for answers before the
    next is due (open loop), and time each call."""
    ids = _ids("PACED")
    latencies: list[float] = []
    tasks: set[asyncio.Task[None]] = set()
    errors: dict[str, int] = {}

    async def one(request: svc.SendMessageRequest) -> None:
        started = time.perf_counter()
        try:
            await _send(mq, request)
        except grpc.aio.AioRpcError as exc:
            errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
            return
        except RuntimeError as exc:  # a v2 status other than OK
            errors[str(exc)] = errors.get(str(exc), 0) + 1
            return
        latencies.append((time.perf_counter() - started) * 1000)

    total = max(1, int(rate * seconds))
    start = time.perf_counter()
    issued = 0
    while issued < total:
        due = min(total, int((time.perf_counter() - start) * rate) + 1)
        while issued < due:
            request = svc.SendMessageRequest(messages=[_message(SINGLE_TOPIC, next(ids))])
            task = asyncio.create_task(one(request))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            issued += 1
        await asyncio.sleep(min(0.001, 1 / rate))
    issue_time = time.perf_counter() - start
    await asyncio.gather(*tasks)
    if errors:
        print(f"  warning: {sum(errors.values())} paced sends failed: {errors}", flush=True)
    return Latencies(sorted(latencies), issued / issue_time, errors)


def _filter() -> pb.FilterExpression:
    return pb.FilterExpression(type=pb.TAG, expression="*")


async def _until_done(
    workers: list[Callable[[], Coroutine[Any, Any, None]]], done: asyncio.Event
) -> None:
    """Run the workers until `done` is set, then cancel those still waiting on the broker."""
    tasks = [asyncio.create_task(w()) for w in workers]
    finished = asyncio.create_task(done.wait())
    try:
        await asyncio.wait([*tasks, finished], return_when=asyncio.FIRST_COMPLETED)
        while not done.is_set():
            failed = [t for t in tasks if t.done() and t.exception() is not None]
            if failed:
                raise failed[0].exception()  # type: ignore[misc]
            if all(t.done() for t in tasks):
                raise RuntimeError("the consumers stopped before reaching the expected count")
            await asyncio.wait([*tasks, finished], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in [*tasks, finished]:
            t.cancel()
        await asyncio.gather(*tasks, finished, return_exceptions=True)


async def consume_receive(
    mq: Stub,
    total: int,
    timeout_s: float,
    topic_name: str = BATCH_TOPIC,
    group_name: str = RECEIVE_GROUP,
) -> tuple[int, float]:
    """RECEIVERS clients: ReceiveMessage (batch 32) then one AckMessage for all it got."""
    got = 0
    done = asyncio.Event()
    end = 0.0
    topic = pb.Resource(name=topic_name)
    group = pb.Resource(name=group_name)
    request = svc.ReceiveMessageRequest(
        group=group,
        message_queue=pb.MessageQueue(topic=topic, id=-1),
        filter_expression=_filter(),
        batch_size=CONSUME_BATCH,
        invisible_duration=Duration(seconds=60),
        long_polling_timeout=Duration(seconds=1),
    )

    async def receiver() -> None:
        nonlocal got, end
        while not done.is_set():
            entries = []
            async for response in mq.ReceiveMessage(request, timeout=5):
                kind = response.WhichOneof("content")
                if kind == "status":
                    _check("ReceiveMessage", response.status, (pb.MESSAGE_NOT_FOUND,))
                elif kind == "message":
                    sp = response.message.system_properties
                    entries.append(
                        svc.AckMessageEntry(
                            message_id=sp.message_id, receipt_handle=sp.receipt_handle
                        )
                    )
            if not entries:
                continue
            ack = await mq.AckMessage(
                svc.AckMessageRequest(group=group, topic=topic, entries=entries),
                timeout=CALL_TIMEOUT_S,
            )
            _check("AckMessage", ack.status)
            got += len(entries)
            if got >= total and not done.is_set():
                end = time.perf_counter()
                done.set()

    start = time.perf_counter()
    await asyncio.wait_for(_until_done([receiver] * RECEIVERS, done), timeout_s)
    return got, end - start


async def consume_pull(mq: Stub, total: int, timeout_s: float) -> tuple[int, float]:
    """One walker per queue: PullMessage (batch 32) from offset 0 to the queue's end."""
    got = 0

    async def walker(queue_id: int) -> None:
        nonlocal got
        offset = 0
        queue = pb.MessageQueue(topic=pb.Resource(name=BATCH_TOPIC), id=queue_id)
        while True:
            request = svc.PullMessageRequest(
                group=pb.Resource(name=PULL_GROUP),
                message_queue=queue,
                offset=offset,
                batch_size=CONSUME_BATCH,
                filter_expression=_filter(),
                long_polling_timeout=Duration(),  # at the end: answer at once
            )
            count = 0
            async for response in mq.PullMessage(request, timeout=CALL_TIMEOUT_S):
                kind = response.WhichOneof("content")
                if kind == "status":
                    _check("PullMessage", response.status, (pb.MESSAGE_NOT_FOUND,))
                elif kind == "message":
                    count += 1
                elif kind == "next_offset":
                    offset = response.next_offset
            if count == 0:
                return
            got += count

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(walker(q) for q in range(QUEUES))), timeout_s)
    elapsed = time.perf_counter() - start
    if got != total:
        print(f"  warning: pulled {got} messages, expected {total}", flush=True)
    return got, elapsed


async def consume_batch_pull(
    pull: Stub, total: int, timeout_s: float, per_queue: int | None = None
) -> tuple[int, float]:
    """One walker per queue: capstan.v1 PullMessages (32 per response) from offset 0 to the
    queue's end, or to `per_queue` messages."""
    got = 0

    async def walker(queue_id: int) -> None:
        nonlocal got
        offset = 0
        while True:
            response = await pull.PullMessages(
                pull_pb2.PullMessagesRequest(
                    group=PULL_GROUP,
                    topic=BATCH_TOPIC,
                    queue_id=queue_id,
                    offset=offset,
                    max_messages=CONSUME_BATCH,
                ),
                timeout=CALL_TIMEOUT_S,
            )
            if response.status != pull_pb2.FOUND:
                return
            got += len(response.messages)
            offset = response.next_begin_offset
            if per_queue is not None and offset >= per_queue:
                return

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(walker(q) for q in range(QUEUES))), timeout_s)
    elapsed = time.perf_counter() - start
    if got != total:
        print(f"  warning: batch-pulled {got} messages, expected {total}", flush=True)
    return got, elapsed


CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


async def capstan_suite(
    broker: BrokerProcess, sizes: Sizes, static: bool = False
) -> dict[str, float | None]:
    """The figures of one broker; with `static`, the batched produce and the receive
    figures of a static topic too, measured right after the normal topic's."""
    cpu = broker.cpu_seconds
    mode = broker.flush_mode + (" over TLS, signed" if broker.security is not None else "")
    async with _channel(broker) as channel:
        await _wait_serving(channel)
        await _prepare(broker.target, broker.security)
        mq = _stub(svc_grpc.MessagingServiceStub(channel), broker)
        await produce_unbatched(mq, 4, 0.3, "WARM")  # warm up the channel and the broker's paths

        total = sizes.batched_messages // BATCH * BATCH
        _announce(f"{mode}: produce {total:,} messages, {BATCH} per call, {IN_FLIGHT} in flight")
        batched = await _measure(lambda: produce_batched(mq, total), cpu)
        _announce(f"{mode}: produce 1 per call, 1 client, {sizes.unbatched_s:.0f} s")
        single = await _measure(lambda: produce_unbatched(mq, 1, sizes.unbatched_s, "ONE"), cpu)
        _announce(f"{mode}: produce 1 per call, {SENDERS} clients, {sizes.unbatched_s:.0f} s")
        many = await _measure(
            lambda: produce_unbatched(mq, SENDERS, sizes.unbatched_s, "MANY"), cpu
        )
        pace = max(10.0, many.msgs_per_s * LATENCY_LOAD)
        _announce(f"{mode}: paced sends at {pace:,.0f} msg/s, {sizes.latency_s:.0f} s")
        paced = await paced_latency(mq, pace, sizes.latency_s)
        timeout = max(60.0, total / 1000)
        _announce(f"{mode}: ReceiveMessage + AckMessage, {RECEIVERS} receivers")
        receive = await _measure(lambda: consume_receive(mq, total, timeout), cpu)
        on_static = await static_suite(mq, total, timeout, cpu) if static else {}
        _announce(f"{mode}: PullMessage, one walker per queue")
        pull = await _measure(lambda: consume_pull(mq, total, timeout), cpu)
        _announce(f"{mode}: capstan.v1 PullMessages, one walker per queue")
        puller = _stub(pull_pb2_grpc.PullStub(channel), broker)  # type: ignore[no-untyped-call]
        batch_pull = await _measure(lambda: consume_batch_pull(puller, total, timeout), cpu)
    return {
        "produce_batched_msgs_per_s": batched.msgs_per_s,
        "produce_unbatched_msgs_per_s": single.msgs_per_s,
        "produce_unbatched_concurrent_msgs_per_s": many.msgs_per_s,
        "consume_msgs_per_s": receive.msgs_per_s,
        "pull_consume_msgs_per_s": pull.msgs_per_s,
        "batch_pull_consume_msgs_per_s": batch_pull.msgs_per_s,
        "send_p50_ms": _percentile(paced.ms, 0.50),
        "send_p99_ms": _percentile(paced.ms, 0.99),
        "send_max_ms": paced.ms[-1] if paced.ms else None,
        "send_paced_msgs_per_s": paced.reached,
        "send_errors": sum(paced.errors.values()),
        **_cpu_figures("produce_batched", batched),
        **_cpu_figures("produce_unbatched", single),
        **_cpu_figures("produce_unbatched_concurrent", many),
        **_cpu_figures("consume", receive),
        **_cpu_figures("pull_consume", pull),
        **_cpu_figures("batch_pull_consume", batch_pull),
        **on_static,
    }


async def static_suite(
    mq: Stub, total: int, timeout_s: float, cpu: Callable[[], float | None]
) -> dict[str, float | None]:
    """A static topic against a normal one of as many queues (TWIN_TOPIC). Four times
    `total` messages to each, produced in eight turns each (static, normal, normal, static,
    ...) so that drift on a shared machine falls on both alike and each turn is long enough for the
    broker's CPU time (read in clock ticks) to be measured; then `total` of each received
    and acknowledged by two consumer groups, in the order static, normal, normal, static,
    so that neither comes first on a cold broker. Besides the rates, the broker's CPU time
    per message of each: the broker is bound by its CPU, and CPU time does not count the
    time a busy host takes the core away, so its ratio holds still where the rates'
    swing."""
    topics = (STATIC_TOPIC, TWIN_TOPIC)
    slices = 8
    part = STATIC_PRODUCE_TIMES * total // slices // BATCH * BATCH
    _announce(f"static topic against a normal one: produce {part * slices:,} messages each")
    sent = dict.fromkeys(topics, 0)
    took = dict.fromkeys(topics, 0.0)
    produce_cpu: dict[str, float | None] = dict.fromkeys(topics, 0.0)
    for turn in range(slices):
        for topic in topics if turn % 2 == 0 else topics[::-1]:
            before = cpu()
            count, seconds = await produce_batched(mq, part, topic)
            produce_cpu[topic] = _cpu_sum(produce_cpu[topic], before, cpu())
            sent[topic] += count
            took[topic] += seconds
    # A receive stops once it has its count; what its last calls took beyond it stays
    # invisible, unacknowledged, and nothing reads it again.
    got = dict.fromkeys(topics, 0)
    receiving = dict.fromkeys(topics, 0.0)
    consume_cpu: dict[str, float | None] = dict.fromkeys(topics, 0.0)
    turns = [(RECEIVE_GROUP, t) for t in topics] + [(SECOND_RECEIVE_GROUP, t) for t in topics[::-1]]
    for group, topic in turns:
        _announce(f"static topic against a normal one: ReceiveMessage + AckMessage, {topic}")
        before = cpu()
        wanted = min(total, sent[topic])
        count, seconds = await consume_receive(mq, wanted, timeout_s, topic, group)
        consume_cpu[topic] = _cpu_sum(consume_cpu[topic], before, cpu())
        got[topic] += count
        receiving[topic] += seconds
    received = {t: got[t] / receiving[t] if receiving[t] > 0 else 0.0 for t in topics}
    figures: dict[str, float | None] = {}
    for prefix, topic in (("static", STATIC_TOPIC), ("twin", TWIN_TOPIC)):
        figures[f"{prefix}_produce_batched_msgs_per_s"] = sent[topic] / took[topic]
        figures[f"{prefix}_consume_msgs_per_s"] = received[topic]
        figures[f"{prefix}_produce_broker_cpu_us_per_msg"] = _per_message(
            produce_cpu[topic], sent[topic]
        )
        figures[f"{prefix}_consume_broker_cpu_us_per_msg"] = _per_message(
            consume_cpu[topic], got[topic]
        )
    return figures


def _cpu_sum(so_far: float | None, before: float | None, after: float | None) -> float | None:
    if so_far is None or before is None or after is None:
        return None
    return so_far + after - before


def _per_message(cpu_s: float | None, messages: int) -> float | None:
    return None if cpu_s is None or not messages else 1e6 * cpu_s / messages


def _cpu_figures(phase: str, rate: Rate) -> dict[str, float | None]:
    return {f"broker_cpu_pct_{phase}": rate.cpu_pct, f"client_cpu_pct_{phase}": rate.client_cpu_pct}


def run_capstan(
    root: pathlib.Path, mode: str, sizes: Sizes, static: bool = False
) -> dict[str, float | None]:
    broker = BrokerProcess(root / mode.lower(), mode)
    print(f"  starting: capstan broker, {mode} ...", flush=True)
    broker.start()
    try:
        return asyncio.run(capstan_suite(broker, sizes, static))
    finally:
        broker.stop()


async def floor_suite(floor: FloorProcess, sizes: Sizes) -> dict[str, float | None]:
    """The same client work against the protocol-only peer (nothing stored)."""
    cpu = floor.cpu_seconds
    async with grpc.aio.insecure_channel(floor.target, options=CHANNEL_OPTIONS) as channel:
        mq = svc_grpc.MessagingServiceStub(channel)
        puller = pull_pb2_grpc.PullStub(channel)  # type: ignore[no-untyped-call]
        await produce_unbatched(mq, 4, 0.3, "WARM")
        total = sizes.batched_messages // BATCH * BATCH
        timeout = max(60.0, total / 1000)
        _announce(f"gRPC floor: produce {total:,}, {BATCH} per call, {IN_FLIGHT} in flight")
        batched = await _measure(lambda: produce_batched(mq, total), cpu)
        _announce(f"gRPC floor: produce 1 per call, 1 client, {sizes.unbatched_s:.0f} s")
        single = await _measure(lambda: produce_unbatched(mq, 1, sizes.unbatched_s, "ONE"), cpu)
        _announce(f"gRPC floor: ReceiveMessage + AckMessage, {RECEIVERS} receivers")
        receive = await _measure(lambda: consume_receive(mq, total, timeout), cpu)
        _announce("gRPC floor: capstan.v1 PullMessages, one walker per queue")
        per_queue = total // QUEUES
        batch_pull = await _measure(
            lambda: consume_batch_pull(puller, total, timeout, per_queue), cpu
        )
    return {
        "floor_produce_batched_msgs_per_s": batched.msgs_per_s,
        "floor_produce_unbatched_msgs_per_s": single.msgs_per_s,
        "floor_consume_msgs_per_s": receive.msgs_per_s,
        "floor_batch_pull_consume_msgs_per_s": batch_pull.msgs_per_s,
        **_cpu_figures("floor_produce_batched", batched),
        **_cpu_figures("floor_produce_unbatched", single),
        **_cpu_figures("floor_consume", receive),
        **_cpu_figures("floor_batch_pull_consume", batch_pull),
    }


def run_floor(root: pathlib.Path, sizes: Sizes) -> dict[str, float | None]:
    floor = FloorProcess(root / "floor")
    print("  starting: gRPC floor peer (protocol only, stores nothing) ...", flush=True)
    floor.start()
    try:
        return asyncio.run(floor_suite(floor, sizes))
    finally:
        floor.stop()


# -- NATS JetStream ---------------------------------------------------------------------


def _find_nats_server() -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/local/sbin"])
    return shutil.which("nats-server", path=path)


def _install_nats_server() -> str | None:
    """Try `apt-get install nats-server` (through `sudo -n` unless root)."""
    apt = shutil.which("apt-get")
    if apt is None:
        print("  nats-server: not on PATH and no apt-get to install it", flush=True)
        return None
    prefix: list[str] = []
    if os.geteuid() != 0:
        sudo = shutil.which("sudo")
        if sudo is None:
            print("  nats-server: not on PATH; not root and no sudo to install it", flush=True)
            return None
        prefix = [sudo, "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = [*prefix, apt, "install", "-y", "-q", "nats-server"]
    for attempt in ([install], [[*prefix, apt, "update", "-q"], install]):
        shown = " && ".join(" ".join(c) for c in attempt)
        print(f"  nats-server: not on PATH; trying {shown}", flush=True)
        try:
            for command in attempt:
                subprocess.run(
                    command,
                    env=env,
                    check=True,
                    timeout=600,
                    capture_output=True,
                    stdin=subprocess.DEVNULL,
                )
        except (OSError, subprocess.SubprocessError) as exc:
            detail = ""
            if isinstance(exc, subprocess.CalledProcessError):
                last = exc.stderr.decode(errors="replace").strip().splitlines()[-1:]
                detail = f": {last[0]}" if last else ""
            print(f"  nats-server: install failed ({type(exc).__name__}{detail})", flush=True)
            continue
        found = _find_nats_server()
        if found is not None:
            return found
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nats-server exited with code {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nats-server did not listen on port {port} within {timeout_s:.0f} s")


async def nats_publish_pipelined(js: Any, total: int) -> tuple[int, float]:
    """publish_async with up to NATS_WINDOW unacknowledged publishes, then wait for all."""
    start = time.perf_counter()
    futures = [await js.publish_async("bench.batch", BODY) for _ in range(total)]
    await js.publish_async_completed()
    elapsed = time.perf_counter() - start
    for f in futures:
        f.result()  # raises what the server refused
    return total, elapsed


async def nats_publish_sequential(js: Any, seconds: float) -> tuple[int, float]:
    sent = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        await js.publish("bench.single", BODY)
        sent += 1
    return sent, time.perf_counter() - start


async def nats_consume(nc: Any, js: Any, total: int, timeout_s: float) -> tuple[int, float]:
    """RECEIVERS pull subscriptions on one durable consumer: fetch 32, ack each."""
    import nats.errors

    got = 0
    done = asyncio.Event()
    end = 0.0

    async def fetcher() -> None:
        nonlocal got, end
        sub = await js.pull_subscribe_bind(durable="bench", stream="BENCH")
        while not done.is_set():
            try:
                msgs = await sub.fetch(CONSUME_BATCH, timeout=1)
            except nats.errors.TimeoutError:
                continue
            for m in msgs:
                await m.ack()
            got += len(msgs)
            if got >= total and not done.is_set():
                await nc.flush()  # the acks have reached the server
                end = time.perf_counter()
                done.set()

    start = time.perf_counter()
    await asyncio.wait_for(_until_done([fetcher] * RECEIVERS, done), timeout_s)
    return got, end - start


async def nats_suite(
    url: str, sizes: Sizes, cpu: Callable[[], float | None]
) -> dict[str, float | None]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType

    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=5)
    try:
        js = nc.jetstream(publish_async_max_pending=NATS_WINDOW, timeout=CALL_TIMEOUT_S)
        await js.add_stream(name="BENCH", subjects=["bench.>"], storage=StorageType.FILE)
        await nats_publish_sequential(js, 0.3)  # warm up
        _announce(f"NATS: publish {sizes.nats_messages:,}, {NATS_WINDOW} in flight")
        pipelined = await _measure(lambda: nats_publish_pipelined(js, sizes.nats_messages), cpu)
        _announce(f"NATS: publish 1 at a time, {sizes.unbatched_s:.0f} s")
        single = await _measure(lambda: nats_publish_sequential(js, sizes.unbatched_s), cpu)
        await js.add_consumer(
            "BENCH",
            ConsumerConfig(
                durable_name="bench",
                filter_subject="bench.batch",
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=60,
            ),
        )
        total = sizes.nats_messages
        _announce(f"NATS: fetch {CONSUME_BATCH} + ack, {RECEIVERS} subscribers, {total:,}")
        timeout = max(60.0, total / 1000)
        consume = await _measure(lambda: nats_consume(nc, js, total, timeout), cpu)
    finally:
        await nc.close()
    figures: dict[str, float | None] = {
        "nats_publish_msgs_per_s": pipelined.msgs_per_s,
        "nats_publish_unbatched_msgs_per_s": single.msgs_per_s,
        "nats_consume_msgs_per_s": consume.msgs_per_s,
    }
    for phase, rate in (
        ("publish", pipelined),
        ("publish_unbatched", single),
        ("consume", consume),
    ):
        figures[f"nats_server_cpu_pct_{phase}"] = rate.cpu_pct
        figures[f"nats_client_cpu_pct_{phase}"] = rate.client_cpu_pct
    return figures


def run_nats(root: pathlib.Path, sizes: Sizes) -> dict[str, float | None] | None:
    """The NATS figures, or None (with the reason printed) if NATS cannot be run here."""
    try:
        import nats  # noqa: F401
    except ImportError:
        print("  NATS skipped: the nats-py package is not installed (pip install nats-py)")
        return None
    server = _find_nats_server() or _install_nats_server()
    if server is None:
        print("  NATS skipped: nats-server is not installed and could not be installed")
        return None
    store = root / "nats"
    store.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    print(f"  starting: nats-server -js, file storage, port {port} ...", flush=True)
    with open(root / "nats.log", "wb") as log:
        proc = subprocess.Popen(
            [server, "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_port(port, proc)
        return asyncio.run(
            nats_suite(f"nats://127.0.0.1:{port}", sizes, lambda: _cpu_seconds(proc.pid))
        )
    except Exception as exc:  # noqa: BLE001 - the peer is optional; keep capstan's figures
        print(f"  NATS skipped: {type(exc).__name__}: {exc}\n{_tail(root / 'nats.log', 5)}")
        return None
    finally:
        _stop(proc, "nats-server", signal.SIGINT)  # it exits 1 on SIGTERM, 0 on SIGINT


# -- report -----------------------------------------------------------------------------


def _rounded(value: float | None, key: str) -> float | None:
    if value is None:
        return None
    return round(value) if key.endswith("_msgs_per_s") else round(value, 2)


def main(quick: bool = False, directory: str | None = None, secure: bool = False) -> None:
    sizes = QUICK if quick else FULL
    if secure:
        main_secure(sizes, directory)
        return
    root = pathlib.Path(tempfile.mkdtemp(prefix="capstan-broker-bench-", dir=directory))
    figures: dict[str, float | None] = {}
    try:
        for mode in FLUSH_MODES:
            prefix = "" if mode == "ASYNC_FLUSH" else "sync_"
            static = mode == "ASYNC_FLUSH"
            for key, value in run_capstan(root, mode, sizes, static).items():
                figures[prefix + key] = value
        figures.update(run_floor(root, sizes))
        nats_figures = run_nats(root, sizes)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for key in (
        "nats_publish_msgs_per_s",
        "nats_publish_unbatched_msgs_per_s",
        "nats_consume_msgs_per_s",
    ):
        figures[key] = None
    if nats_figures is not None:
        figures.update(nats_figures)
    for name, ours, theirs in (
        (
            "ratio_produce_batched_to_floor",
            "produce_batched_msgs_per_s",
            "floor_produce_batched_msgs_per_s",
        ),
        ("ratio_consume_to_floor", "consume_msgs_per_s", "floor_consume_msgs_per_s"),
        (
            "ratio_static_produce_batched_to_normal",
            "static_produce_batched_msgs_per_s",
            "twin_produce_batched_msgs_per_s",
        ),
        ("ratio_static_consume_to_normal", "static_consume_msgs_per_s", "twin_consume_msgs_per_s"),
        # Messages per CPU second, static over normal: the normal topic's cost per message
        # over the static one's.
        (
            "ratio_static_produce_cpu_to_normal",
            "twin_produce_broker_cpu_us_per_msg",
            "static_produce_broker_cpu_us_per_msg",
        ),
        (
            "ratio_static_consume_cpu_to_normal",
            "twin_consume_broker_cpu_us_per_msg",
            "static_consume_broker_cpu_us_per_msg",
        ),
        ("ratio_produce_batched_to_nats", "produce_batched_msgs_per_s", "nats_publish_msgs_per_s"),
        (
            "ratio_produce_unbatched_to_nats",
            "produce_unbatched_msgs_per_s",
            "nats_publish_unbatched_msgs_per_s",
        ),
        ("ratio_consume_to_nats", "consume_msgs_per_s", "nats_consume_msgs_per_s"),
        ("ratio_pull_consume_to_nats", "pull_consume_msgs_per_s", "nats_consume_msgs_per_s"),
        (
            "ratio_batch_pull_consume_to_nats",
            "batch_pull_consume_msgs_per_s",
            "nats_consume_msgs_per_s",
        ),
    ):
        a, b = figures.get(ours), figures.get(theirs)
        figures[name] = a / b if a is not None and b else None
    figures["send_latency_load_fraction"] = LATENCY_LOAD
    result = {k: _rounded(v, k) for k, v in figures.items()}
    _print_table(result)
    print(json.dumps(result, sort_keys=True))


def _cell(value: float | None, width: int, digits: int = 0) -> str:
    if value is None:
        return f"{'-':>{width}}"
    return f"{value:>{width},.{digits}f}"


def _print_table(f: dict[str, float | None]) -> None:
    rows: list[tuple[str, str, str | None, int]] = [
        (
            f"produce, {BATCH}/call, {IN_FLIGHT} calls in flight",
            "produce_batched_msgs_per_s",
            "nats_publish_msgs_per_s",
            0,
        ),
        (
            "produce, 1/call, 1 client",
            "produce_unbatched_msgs_per_s",
            "nats_publish_unbatched_msgs_per_s",
            0,
        ),
        (f"produce, 1/call, {SENDERS} clients", "produce_unbatched_concurrent_msgs_per_s", None, 0),
        (
            f"ReceiveMessage {CONSUME_BATCH} + ack, {RECEIVERS} rcv",
            "consume_msgs_per_s",
            "nats_consume_msgs_per_s",
            0,
        ),
        (
            f"PullMessage {CONSUME_BATCH}, {QUEUES} queues",
            "pull_consume_msgs_per_s",
            "nats_consume_msgs_per_s",
            0,
        ),
        (
            f"capstan.v1 PullMessages {CONSUME_BATCH}, {QUEUES} q",
            "batch_pull_consume_msgs_per_s",
            "nats_consume_msgs_per_s",
            0,
        ),
        ("static topic: produce, batched", "static_produce_batched_msgs_per_s", None, 0),
        ("  its normal twin, same turns", "twin_produce_batched_msgs_per_s", None, 0),
        ("static topic: ReceiveMessage + ack", "static_consume_msgs_per_s", None, 0),
        ("  its normal twin", "twin_consume_msgs_per_s", None, 0),
        ("paced sends, msg/s reached", "send_paced_msgs_per_s", None, 0),
        ("send latency p50, ms", "send_p50_ms", None, 2),
        ("send latency p99, ms", "send_p99_ms", None, 2),
        ("send latency max, ms", "send_max_ms", None, 2),
    ]
    print(
        f"\n{'figure (1 KiB messages, msg/s)':38} {'ASYNC_FLUSH':>11} {'SYNC_FLUSH':>11}"
        f" {'NATS JS':>10} {'async/NATS':>10} {'gRPC floor':>10} {'async/floor':>11}"
    )
    for name, key, peer, digits in rows:
        ours, sync = f.get(key), f.get("sync_" + key)
        theirs = f.get(peer) if peer else None
        ratio = ours / theirs if ours is not None and theirs else None
        floor = f.get("floor_" + key)
        of_floor = ours / floor if ours is not None and floor else None
        line = f"{name:38} {_cell(ours, 11, digits)} {_cell(sync, 11, digits)}"
        if peer or floor is not None:
            line += f" {_cell(theirs, 10)} {_cell(ratio, 10, 2)}"
        if floor is not None:
            line += f" {_cell(floor, 10)} {_cell(of_floor, 11, 2)}"
        print(line)
    print(
        f"\n{'CPU, % of one core: server / client':38} {'ASYNC_FLUSH':>11} {'SYNC_FLUSH':>11}"
        f" {'NATS JS':>10}"
    )
    phases = (
        ("produce, batched / pipelined", "produce_batched", "publish"),
        ("produce, 1/call, 1 client", "produce_unbatched", "publish_unbatched"),
        (f"produce, 1/call, {SENDERS} clients", "produce_unbatched_concurrent", None),
        ("consume, ReceiveMessage / fetch", "consume", "consume"),
        ("consume, PullMessage", "pull_consume", None),
        ("consume, capstan.v1 PullMessages", "batch_pull_consume", None),
    )
    for name, phase, peer in phases:
        cells = [
            _pair(
                f.get(f"{prefix}broker_cpu_pct_{phase}"), f.get(f"{prefix}client_cpu_pct_{phase}")
            )
            for prefix in ("", "sync_")
        ]
        if peer is not None:
            cells.append(
                _pair(f.get(f"nats_server_cpu_pct_{peer}"), f.get(f"nats_client_cpu_pct_{peer}"))
            )
        print(f"{name:38} " + " ".join(f"{c:>11}" for c in cells))
    print(
        f"NATS publish: publish_async, {NATS_WINDOW} in flight (capstan: {IN_FLIGHT} x {BATCH});"
        f" NATS consume: fetch {CONSUME_BATCH}, ack each.\n"
        f"NATS file storage fsyncs in the background: compare it with ASYNC_FLUSH.\n"
        f"Paced sends: 1 message per call at {LATENCY_LOAD:.0%} of the {SENDERS}-client"
        " unbatched peak, open loop; client and servers share this machine.\n"
        "gRPC floor: a grpc.aio server answering the same calls with prebuilt replies and"
        " storing nothing (bench/grpc_floor.py): the most a grpc.aio broker reaches here.\n"
    )


def _pair(server: float | None, client: float | None) -> str:
    if server is None and client is None:
        return "-"
    return "/".join("-" if v is None else f"{v:.0f}" for v in (server, client))


# -- TLS and authentication: the same figures, secured, against plaintext ------------------


@dataclass(frozen=True)
class BenchSecurity:
    """A local CA, a certificate for 127.0.0.1, the cluster's secret and a super user."""

    ca: pathlib.Path
    cert: pathlib.Path
    key: pathlib.Path
    cluster_secret: pathlib.Path
    admin_file: pathlib.Path
    admin: Credentials
    """A super user: it sets the broker up."""
    app: Credentials
    """A normal user allowed Pub and Sub on every topic and group: the client that
    produces and consumes, checked against its policy on every call."""

    @classmethod
    def make(cls, root: pathlib.Path) -> BenchSecurity:
        ca = create_ca(root / "ca")
        pair = ca.issue(root, "broker", ["127.0.0.1"])
        secret = root / "cluster-secret"
        secret.write_text("bench-cluster-secret-" + os.urandom(8).hex())
        admin = Credentials("bench", "bench-secret-" + os.urandom(8).hex())
        write_credentials_file(root / "admin.json", admin)
        app = Credentials("bench-app", "bench-app-secret-" + os.urandom(8).hex())
        return cls(
            ca.certificate, pair.certificate, pair.key, secret, root / "admin.json", admin, app
        )

    def settings(self) -> dict[str, Any]:
        return {
            "tls": {
                "enabled": True,
                "cert_file": str(self.cert),
                "key_file": str(self.key),
                "ca_file": str(self.ca),
            },
            "auth": {
                "enabled": True,
                "cluster_secret_file": str(self.cluster_secret),
                "init_user_file": str(self.admin_file),
            },
        }


def _channel(broker: BrokerProcess) -> grpc.aio.Channel:
    """The benchmark's channel: plaintext, or TLS trusting the bench's CA."""
    security = broker.security
    if security is None:
        return grpc.aio.insecure_channel(broker.target, options=CHANNEL_OPTIONS)
    tls = grpc.ssl_channel_credentials(root_certificates=security.ca.read_bytes())
    return grpc.aio.secure_channel(broker.target, tls, options=CHANNEL_OPTIONS)


class _SignedStub:
    """A stub whose every call carries a fresh signature in its metadata, made in the
    calling thread, as the official clients sign (gRPC call credentials would run a
    plugin on a thread of its own per call)."""

    def __init__(self, stub: Any, keys: Credentials) -> None:
        self._stub = stub
        self._keys = keys

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)
        keys = self._keys

        def call(request: Any, **kwargs: Any) -> Any:
            return method(request, metadata=signed_metadata(keys), **kwargs)

        return call


def _stub(stub: Any, broker: BrokerProcess) -> Any:
    """`stub`, signing as the bench's application user when the broker is secured."""
    return stub if broker.security is None else _SignedStub(stub, broker.security.app)


SECURED_FIGURES = (
    "produce_batched_msgs_per_s",
    "produce_unbatched_msgs_per_s",
    "produce_unbatched_concurrent_msgs_per_s",
    "consume_msgs_per_s",
    "pull_consume_msgs_per_s",
    "batch_pull_consume_msgs_per_s",
)


async def interleaved_suites(
    brokers: Sequence[BrokerProcess], sizes: Sizes
) -> list[dict[str, float | None]]:
    """The figures of `capstan_suite` for each broker, phase by phase: every phase runs on
    each broker in turn, the order swapping from one phase to the next, so a stretch in which
    the machine runs slower weighs on both alike (run one after the other, the per-call
    figures of two identical brokers differed by a quarter on the 2-core VM)."""
    total = sizes.batched_messages // BATCH * BATCH
    timeout = max(60.0, total / 1000)
    async with contextlib.AsyncExitStack() as stack:
        stubs = []
        for broker in brokers:
            channel = await stack.enter_async_context(_channel(broker))
            await _wait_serving(channel)
            await _prepare(broker.target, broker.security)
            mq = _stub(svc_grpc.MessagingServiceStub(channel), broker)
            puller = _stub(pull_pb2_grpc.PullStub(channel), broker)  # type: ignore[no-untyped-call]
            await produce_unbatched(mq, 4, 0.3, "WARM")
            stubs.append((mq, puller))
        figures: list[dict[str, float | None]] = [{} for _ in brokers]
        paces = [10.0 for _ in brokers]

        async def phase(index: int, key: str) -> None:
            broker, (mq, puller) = brokers[index], stubs[index]
            label = f"{broker.flush_mode}{' over TLS, signed' if broker.security else ''}"
            if key == "paced":  # at half the rate the concurrent senders reached
                _announce(f"{label}: paced sends at {paces[index]:,.0f} msg/s")
                paced = await paced_latency(mq, paces[index], sizes.latency_s)
                figures[index]["send_p50_ms"] = _percentile(paced.ms, 0.50)
                return
            works: dict[str, Callable[[], Awaitable[tuple[int, float]]]] = {
                "produce_batched": lambda: produce_batched(mq, total),
                "produce_unbatched": lambda: produce_unbatched(mq, 1, sizes.unbatched_s, "ONE"),
                "produce_unbatched_concurrent": lambda: produce_unbatched(
                    mq, SENDERS, sizes.unbatched_s, "MANY"
                ),
                "consume": lambda: consume_receive(mq, total, timeout),
                "pull_consume": lambda: consume_pull(mq, total, timeout),
                "batch_pull_consume": lambda: consume_batch_pull(puller, total, timeout),
            }
            _announce(f"{label}: {key.replace('_', ' ')}")
            rate = await _measure(works[key], broker.cpu_seconds)
            figures[index][f"{key}_msgs_per_s"] = rate.msgs_per_s
            if key == "produce_unbatched_concurrent":
                paces[index] = max(10.0, rate.msgs_per_s * LATENCY_LOAD)

        keys = [
            "produce_batched",
            "produce_unbatched",
            "produce_unbatched_concurrent",
            "paced",
            "consume",
            "pull_consume",
            "batch_pull_consume",
        ]
        for n, key in enumerate(keys):
            order = range(len(brokers)) if n % 2 == 0 else reversed(range(len(brokers)))
            for index in order:
                await phase(index, key)
    return figures


def main_secure(sizes: Sizes, directory: str | None) -> None:
    """ASYNC_FLUSH in plaintext and with TLS and authentication on, both running, phase by
    phase in turn (`interleaved_suites`): each figure of the secured broker and its ratio
    to the plaintext one."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="capstan-secure-bench-", dir=directory))
    brokers = [
        BrokerProcess(root / "plain", "ASYNC_FLUSH"),
        BrokerProcess(
            root / "secure", "ASYNC_FLUSH", BenchSecurity.make(root / "secure" / "security")
        ),
    ]
    try:
        print("  starting: two capstan brokers, plaintext and with TLS and auth ...", flush=True)
        for broker in brokers:
            broker.start()
        plain, secured = asyncio.run(interleaved_suites(brokers, sizes))
    finally:
        for broker in brokers:
            broker.stop()
        shutil.rmtree(root, ignore_errors=True)
    figures: dict[str, float | None] = {}
    for key in SECURED_FIGURES:
        a, b = secured.get(key), plain.get(key)
        figures[key] = b
        figures[f"secure_{key}"] = a
        figures[f"ratio_secure_{key.removesuffix('_msgs_per_s')}"] = a / b if a and b else None
    figures["send_p50_ms"] = plain.get("send_p50_ms")
    figures["secure_send_p50_ms"] = secured.get("send_p50_ms")
    result = {k: _rounded(v, k) for k, v in figures.items()}
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"  {key:<{width}}  {value}")
    print(json.dumps(result, sort_keys=True))
