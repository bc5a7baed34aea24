"""`capstan bench failover`: every kind of consumer through every fault, as real processes
on 127.0.0.1.

A controller and two broker groups of a master and a slave each (default settings), a
normal topic on the first group and a static topic over both. The official RocketMQ 5
producer sends to both topics the whole time, one message per call, while six consumers,
each a consumer group of its own subscribed to both topics, consume: Capstan's SDK push
consumer (concurrent and orderly), lite pull consumer and simple consumer, and the official
SimpleConsumer and PushConsumer. The faults, each in turn, each repeated (3 times with
`--quick`, 5 without):

- `kill9_master`: the first group's master killed with SIGKILL (started again afterwards);
- `replica_gone`: the replica the routes name first killed, not started again until the
  figures are taken (a pod on a lost node);
- `sigstop_slave`: the first group's slave stopped (SIGSTOP) for 10 s;
- `sigstop_master`: the first group's master stopped (SIGSTOP) for 10 s, a hung process
  with its connections open (it returns as a slave);
- `static_remap`: one logic queue of the static topic moved to the other group;
- `kill9_controller`: the controller killed and started again 1 s later (a supervisor's
  restart);
- `kill9_master_controller`: the first group's master and the controller killed at once,
  the controller started again 1 s later (a machine holding both lost), the master after
  the figures are taken.

Figures, per consumer kind and fault, the worst of the repetitions: `resume_s`, from the
fault to the first message sent after it that the kind consumed; `delay_s`, the longest
any message of the fault's topic acknowledged around the fault (from 1 s before it to 3 s
after it ended) waited from its acknowledgement to its consumption. Per fault, the
producer's longest gap between two acknowledged sends of that topic across it, and its
longest single send call (the official client's own retries included). Per kind,
acknowledged messages never consumed (lost) and messages consumed more than once
(duplicates: a consumer that failed over may be handed again what it had not yet
committed).

Prints a table, then one line of JSON with the figures (the last line of output).
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import pathlib
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from capstan.bench.broker_bench import _free_port, _tail
from capstan.bench.ha_bench import Process, broker_config, controller_process
from capstan.client.admin import BlockingAdminClient, BlockingControllerClient
from capstan.client.errors import ClientError
from capstan.client.queue_mapping_wire import mapping_from_wire
from capstan.v1 import admin_pb2 as apb
from capstan.v1 import controller_pb2 as cpb

GROUPS = ("fo-a", "fo-b")
TOPIC = "FailoverTopic"
"""A normal topic on the first group: what the broker and controller faults hit."""
STATIC_TOPIC = "FailoverStatic"
"""A static topic, its logic queues spread over both groups: what the remap moves."""
QUEUES = 4
KINDS = (
    "sdk_push",
    "sdk_orderly",
    "sdk_lite_pull",
    "sdk_simple",
    "official_simple",
    "official_push",
)
FAULTS = (
    "kill9_master",
    "replica_gone",
    "sigstop_slave",
    "sigstop_master",
    "static_remap",
    "kill9_controller",
    "kill9_master_controller",
)
STOP_S = 10.0
"""How long the slave stays stopped."""
CONTROLLER_RESTART_S = 1.0
FAULT_TYPICAL_S = 12.0
"""About how long one fault takes here, its waiting and healing included (the two SIGSTOPs
take twice that), for the estimate the bench starts by printing."""
BEFORE_S = 1.0
AFTER_S = 3.0
"""The window of a fault's figures: from BEFORE_S before it to AFTER_S after it ended."""
DRAIN_LIMIT_S = 30.0
"""How long every consumer is given to consume what was acknowledged, per fault and at the
end; what is still missing then counts as waiting that long (and, at the end, as lost)."""
SETTLE_LIMIT_S = 60.0
SEND_PAUSE_S = 0.01


@dataclass
class Sent:
    topic: str
    began: float
    acked: float | None = None
    failed: float | None = None
    error: str = ""


@dataclass
class Consumed:
    """What one consumer kind consumed: when it first saw each body, and how often."""

    first: dict[bytes, float] = field(default_factory=dict)
    times: collections.Counter[bytes] = field(default_factory=collections.Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, bodies: list[bytes]) -> None:
        now = time.monotonic()
        with self.lock:
            for body in bodies:
                self.first.setdefault(body, now)
                self.times[body] += 1

    def seen(self, body: bytes) -> float | None:
        with self.lock:
            return self.first.get(body)


class Cluster:
    """The controller and both groups' brokers, as processes; restarts and faults."""

    def __init__(self, root: pathlib.Path) -> None:
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        self.controller = controller_process(root, port)
        self.brokers: dict[str, Process] = {}
        """By host:port."""
        self.group_of: dict[str, str] = {}
        for group in GROUPS:
            for i in (1, 2):
                broker_port = _free_port()
                p = Process(f"{group} broker {i}", root / f"{group}-{i}", {}, "broker")
                p.config = broker_config(p.root, broker_port, self.address)
                p.config["broker_name"] = group
                address = f"127.0.0.1:{broker_port}"
                self.brokers[address] = p
                self.group_of[address] = group
        self.admin = BlockingControllerClient(self.address, timeout_s=5, retry_s=0)

    def start(self) -> None:
        self.controller.start()
        for p in self.brokers.values():
            p.start()

    def stop(self) -> None:
        for p in (*self.brokers.values(), self.controller):
            p.resume()
            p.stop()
        self.admin.close()

    def logs(self) -> str:
        """The end of each process's log, the first group's brokers (the faults') last."""
        first = [p for a, p in self.brokers.items() if self.group_of[a] == GROUPS[0]]
        others = [p for p in self.brokers.values() if p not in first]
        return "\n".join(
            f"--- {p.name} log:\n{_tail(p.root / 'out.log', 40)}"
            for p in (*others, self.controller, *first)
        )

    def info(self, group: str) -> cpb.ReplicaInfo | None:
        try:
            info: cpb.ReplicaInfo = self.admin.replica_info(group)
        except ClientError:
            return None
        return info

    def settled(self, group: str) -> cpb.ReplicaInfo:
        """Until the group has a master, both replicas in its SyncStateSet and alive."""
        deadline = time.monotonic() + SETTLE_LIMIT_S
        info = None
        while time.monotonic() < deadline:
            info = self.info(group)
            if (
                info is not None
                and info.master_id
                and len(info.sync_state_set) == 2
                and sum(r.alive for r in info.replicas) == 2
            ):
                return info
            time.sleep(0.05)
        seen = (
            "no answer from the controller"
            if info is None
            else f"master {info.master_id} at epoch {info.master_epoch}, SyncStateSet "
            f"{sorted(info.sync_state_set)}, alive "
            f"{sorted(r.broker_id for r in info.replicas if r.alive)}"
        )
        exited = [
            f"{p.name} (code {p.proc.returncode})"
            for p in self.brokers.values()
            if p.proc is not None and p.proc.poll() is not None
        ]
        raise RuntimeError(
            f"group {group} did not settle with both replicas in sync within "
            f"{SETTLE_LIMIT_S:.0f} s (last seen: {seen}; exited by themselves: "
            f"{', '.join(exited) or 'none'})"
        )

    def master(self, group: str) -> Process:
        return self.brokers[self.settled(group).master_address]

    def slave(self, group: str) -> Process:
        info = self.settled(group)
        (address,) = [r.address for r in info.replicas if r.broker_id != info.master_id]
        return self.brokers[address]

    def first_routed(self, group: str) -> Process:
        """The replica routes name first (they list a group's replicas by broker id)."""
        info = self.settled(group)
        return self.brokers[min(info.replicas, key=lambda r: r.broker_id).address]

    def prepare(self) -> None:
        """The topics (the normal one on the first group's master) and consumer groups."""
        for group in GROUPS:
            self.settled(group)
        with BlockingAdminClient(address_of(self.master(GROUPS[0])), timeout_s=20) as admin:
            admin.create_topic(
                apb.Topic(name=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
            )
        with BlockingAdminClient(self.address, timeout_s=20) as admin:
            admin.create_static_topic(
                apb.Topic(name=STATIC_TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES),
                GROUPS,
            )
            for kind in KINDS:
                admin.create_group(apb.Group(name=f"bench-{kind}"))

    def remap(self, queue: int) -> None:
        """Move logic queue `queue` of the static topic to the group that does not lead it."""
        with BlockingAdminClient(self.address, timeout_s=20) as admin:
            mapping = mapping_from_wire(admin.get_queue_mapping(STATIC_TOPIC).mapping)
            leader = mapping.leader(queue).group
            target = next(g for g in GROUPS if g != leader)
            admin.remap_static_queue(STATIC_TOPIC, queue, target)


def address_of(p: Process) -> str:
    return f"127.0.0.1:{p.config['grpc_port']}"


# -- the producer ------------------------------------------------------------------------


class Sending:
    """The official producer sending to both topics in turn until stopped."""

    def __init__(self, address: str) -> None:
        from rocketmq import ClientConfiguration, Credentials, Producer

        config = ClientConfiguration(address, Credentials(), request_timeout=3)
        self._producer = Producer(config, (TOPIC, STATIC_TOPIC))
        self.sent: dict[bytes, Sent] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._routine, name="bench-producer", daemon=True)

    def start(self) -> None:
        self._producer.startup()
        self._thread.start()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(30)
        self._producer.shutdown()

    def _routine(self) -> None:
        from rocketmq import Message

        for n in range(1_000_000_000):
            if self._stop.is_set():
                return
            topic = (TOPIC, STATIC_TOPIC)[n % 2]
            body = f"{topic}-{n}".encode()
            message = Message()
            message.topic = topic
            message.body = body
            record = Sent(topic, time.monotonic())
            with self._lock:
                self.sent[body] = record
            try:
                self._producer.send(message)
            except Exception as exc:  # noqa: BLE001 - the client raises its own error types
                record.failed = time.monotonic()
                record.error = " ".join(str(exc).split())[:160]
                time.sleep(SEND_PAUSE_S)
                continue
            record.acked = time.monotonic()
            time.sleep(SEND_PAUSE_S)

    def snapshot(self) -> list[tuple[bytes, Sent]]:
        with self._lock:
            return list(self.sent.items())


# -- the consumers -----------------------------------------------------------------------


def _sdk_push(address: str, group: str, consumed: Consumed, orderly: bool) -> Callable[[], None]:
    from capstan.client.consumer.push_consumer import PushConsumer
    from capstan.client.consumer.settings import ConsumeFromWhere, ConsumerOptions, ConsumeStatus

    def listener(batch: object, context: object) -> ConsumeStatus:
        consumed.add([m.body for m in batch])  # type: ignore[attr-defined]
        return ConsumeStatus.CONSUME_SUCCESS

    options = ConsumerOptions(consume_from_where=ConsumeFromWhere.FIRST_OFFSET)
    consumer = PushConsumer(address, group, listener, orderly=orderly, options=options)
    consumer.subscribe(TOPIC)
    consumer.subscribe(STATIC_TOPIC)
    consumer.start()

    def stop() -> None:
        consumer.shutdown()

    return stop


def _in_thread(
    name: str, step: Callable[[], None], close: Callable[[], None]
) -> Callable[[], None]:
    """Run `step` over and over in a thread until the returned stop is called; a step that
    raises is tried again shortly (a consumer's call failing mid-fault)."""
    stopping = threading.Event()

    def routine() -> None:
        seen: set[str] = set()
        while not stopping.is_set():
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - the fault's own failures
                what = type(exc).__name__
                if what not in seen:  # each kind of failure once, to tell what went on
                    seen.add(what)
                    print(f"  ({name}: {exc!r:.300})", file=sys.stderr, flush=True)
                time.sleep(0.05)

    thread = threading.Thread(target=routine, name=name, daemon=True)
    thread.start()

    def stop() -> None:
        stopping.set()
        thread.join(30)
        close()

    return stop


def _sdk_lite_pull(address: str, group: str, consumed: Consumed) -> Callable[[], None]:
    from capstan.client.consumer.lite_pull_consumer import LitePullConsumer
    from capstan.client.consumer.settings import ConsumeFromWhere, ConsumerOptions

    options = ConsumerOptions(consume_from_where=ConsumeFromWhere.FIRST_OFFSET)
    consumer = LitePullConsumer(address, group, options=options)
    consumer.subscribe(TOPIC)
    consumer.subscribe(STATIC_TOPIC)
    consumer.start()
    return _in_thread(
        "bench-lite-pull",
        lambda: consumed.add([m.body for m in consumer.poll(0.2)]),
        consumer.shutdown,
    )


def _sdk_simple(address: str, group: str, consumed: Consumed) -> Callable[[], None]:
    from capstan.client.consumer.simple_consumer import SimpleConsumer

    stops = []
    for topic in (TOPIC, STATIC_TOPIC):
        consumer = SimpleConsumer(address, group, topic, retry_window_s=5).start()

        def step(consumer: SimpleConsumer = consumer) -> None:
            for m in consumer.receive(16, invisible_s=15, wait_s=5):
                consumed.add([m.message.body])
                consumer.ack(m)

        stops.append(_in_thread(f"bench-sdk-simple-{topic}", step, consumer.shutdown))

    def stop_both() -> None:
        for stop in stops:
            stop()

    return stop_both


def _official_config(address: str) -> object:
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(address, Credentials(), request_timeout=3)


def _official_simple(address: str, group: str, consumed: Consumed) -> Callable[[], None]:
    from rocketmq import FilterExpression, SimpleConsumer

    everything = {TOPIC: FilterExpression("*"), STATIC_TOPIC: FilterExpression("*")}
    consumer = SimpleConsumer(_official_config(address), group, everything, await_duration=5)
    consumer.startup()

    def step() -> None:
        for m in consumer.receive(16, 15):
            consumed.add([m.body])
            consumer.ack(m)

    return _in_thread("bench-official-simple", step, consumer.shutdown)


def _official_push(address: str, group: str, consumed: Consumed) -> Callable[[], None]:
    from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

    class Listener(MessageListener):  # type: ignore[misc]
        def consume(self, message: object) -> ConsumeResult:
            consumed.add([message.body])  # type: ignore[attr-defined]
            return ConsumeResult.SUCCESS

    everything = {TOPIC: FilterExpression("*"), STATIC_TOPIC: FilterExpression("*")}
    consumer = PushConsumer(_official_config(address), group, Listener(), everything)
    consumer.startup()
    return consumer.shutdown  # type: ignore[no-any-return]


START: dict[str, Callable[[str, str, Consumed], Callable[[], None]]] = {
    "sdk_push": lambda a, g, c: _sdk_push(a, g, c, orderly=False),
    "sdk_orderly": lambda a, g, c: _sdk_push(a, g, c, orderly=True),
    "sdk_lite_pull": _sdk_lite_pull,
    "sdk_simple": _sdk_simple,
    "official_simple": _official_simple,
    "official_push": _official_push,
}


# -- the faults --------------------------------------------------------------------------


@dataclass
class FaultRun:
    fault: str
    topic: str
    at: float
    ended: float = 0.0


def _fault(cluster: Cluster, fault: str, rep: int) -> tuple[FaultRun, Callable[[], None]]:
    """Make the fault; the run (with when it ended) and what heals it afterwards."""
    group = GROUPS[0]
    if fault in ("kill9_master", "replica_gone"):
        victim = cluster.master(group) if fault == "kill9_master" else cluster.first_routed(group)
        run = FaultRun(fault, TOPIC, time.monotonic())
        victim.kill()
        run.ended = run.at

        def restart() -> None:
            victim.start()
            cluster.settled(group)

        return run, restart
    if fault in ("sigstop_slave", "sigstop_master"):
        stopped = cluster.slave(group) if fault == "sigstop_slave" else cluster.master(group)
        run = FaultRun(fault, TOPIC, time.monotonic())
        stopped.pause()
        time.sleep(STOP_S)
        stopped.resume()
        run.ended = time.monotonic()

        def settle_group() -> None:
            cluster.settled(group)

        return run, settle_group
    if fault == "static_remap":
        run = FaultRun(fault, STATIC_TOPIC, time.monotonic())
        cluster.remap(rep % QUEUES)
        run.ended = time.monotonic()
        return run, lambda: None
    if fault in ("kill9_controller", "kill9_master_controller"):
        master = cluster.master(group) if fault == "kill9_master_controller" else None
        run = FaultRun(fault, TOPIC, time.monotonic())
        if master is not None:
            master.kill()
        cluster.controller.kill()
        time.sleep(CONTROLLER_RESTART_S)
        cluster.controller.start()
        run.ended = time.monotonic()

        def settle() -> None:
            if master is not None:
                master.start()
            for g in GROUPS:
                cluster.settled(g)

        return run, settle
    raise ValueError(f"unknown fault {fault!r}")


def _drain(sending: Sending, consumed: dict[str, Consumed], until: float) -> None:
    """Until every kind consumed every message acknowledged so far, or `until`."""
    want = [body for body, s in sending.snapshot() if s.acked is not None]
    while time.monotonic() < until:
        if all(c.seen(body) is not None for c in consumed.values() for body in want):
            return
        time.sleep(0.1)


def _figures(
    run: FaultRun, sending: Sending, consumed: dict[str, Consumed], measured_at: float
) -> dict[str, float]:
    """This run's figures (see the module's docstring)."""
    low, high = run.at - BEFORE_S, run.ended + AFTER_S
    sent = [(body, s) for body, s in sending.snapshot() if s.topic == run.topic]
    figures = {}
    acks = sorted(s.acked for _, s in sent if s.acked is not None)
    gaps = [b - a for a, b in itertools.pairwise(acks) if b >= low and a <= high]
    figures["send_gap_s"] = max(gaps, default=high - low)
    calls = [(s.acked or s.failed or measured_at) - s.began for _, s in sent if s.began >= low]
    figures["longest_send_s"] = max(calls, default=0.0)
    figures["failed_sends"] = float(sum(1 for _, s in sent if s.failed and low <= s.began <= high))
    for kind, c in consumed.items():
        after = [c.seen(body) for body, s in sent if s.began >= run.at]
        seen_after = [t for t in after if t is not None]
        figures[f"{kind}_resume_s"] = min(seen_after, default=measured_at) - run.at
        delays = [
            (c.seen(body) or measured_at) - s.acked
            for body, s in sent
            if s.acked is not None and low <= s.acked <= high
        ]
        figures[f"{kind}_delay_s"] = max(delays, default=0.0)
    return figures


# -- the run -----------------------------------------------------------------------------


def _missing(
    sending: Sending, consumed: Consumed, topic: str | None = None, by: float = float("inf")
) -> int:
    """Messages acknowledged before `by` (of `topic`, or of both) that `consumed` has not
    seen."""
    return sum(
        1
        for body, s in sending.snapshot()
        if s.acked is not None
        and s.acked < by
        and topic in (None, s.topic)
        and consumed.seen(body) is None
    )


def run(root: pathlib.Path, repetitions: int) -> dict[str, float]:
    cluster = Cluster(root)
    cluster.start()
    stops: list[Callable[[], None]] = []
    sending: Sending | None = None
    try:
        cluster.prepare()
        consumed = {kind: Consumed() for kind in KINDS}
        stops.extend(START[k](cluster.address, f"bench-{k}", consumed[k]) for k in KINDS)
        sending = Sending(cluster.address)
        sending.start()
        time.sleep(AFTER_S)
        began = time.monotonic()
        _drain(sending, consumed, began + SETTLE_LIMIT_S)
        slow = {
            kind: {t: _missing(sending, c, t, began) for t in (TOPIC, STATIC_TOPIC)}
            for kind, c in consumed.items()
            if _missing(sending, c, by=began)
        }
        if slow:
            raise RuntimeError(f"not consuming in time (messages missing by topic): {slow}")
        worst: dict[str, float] = {}
        for rep in range(repetitions):
            for fault in FAULTS:
                run, heal = _fault(cluster, fault, rep)
                time.sleep(AFTER_S)
                _drain(sending, consumed, time.monotonic() + DRAIN_LIMIT_S)
                figures = _figures(run, sending, consumed, time.monotonic())
                heal()
                for name, value in figures.items():
                    key = f"{fault}_{name}"
                    worst[key] = max(worst.get(key, 0.0), value)
                slowest = max(KINDS, key=lambda k: figures[f"{k}_resume_s"])
                errors = collections.Counter(
                    s.error
                    for _, s in sending.snapshot()
                    if s.failed and run.at - BEFORE_S <= s.began <= run.ended + AFTER_S
                )
                print(
                    f"  {rep + 1}/{repetitions} {fault:<17} send gap "
                    f"{figures['send_gap_s']:5.2f} s (longest send "
                    f"{figures['longest_send_s']:5.2f} s); slowest to resume {slowest} "
                    f"{figures[f'{slowest}_resume_s']:5.2f} s; longest delay "
                    f"{max(figures[f'{k}_delay_s'] for k in KINDS):5.2f} s",
                    flush=True,
                )
                for error, count in errors.most_common(3):
                    print(f"      {count} failed send(s): {error}", flush=True)
        sending.stop()
        _drain(sending, consumed, time.monotonic() + DRAIN_LIMIT_S)
        acked = sum(1 for _, s in sending.snapshot() if s.acked is not None)
        worst["acknowledged"] = float(acked)
        for kind, c in consumed.items():
            worst[f"{kind}_lost"] = float(_missing(sending, c))
            with c.lock:
                worst[f"{kind}_duplicates"] = float(sum(n - 1 for n in c.times.values()))
        return worst
    except Exception as exc:
        # The clients first, so their own complaints (each failed call) end before the
        # processes' logs, and the error is the last thing said.
        _stop_clients(sending, stops)
        print(cluster.logs(), file=sys.stderr)
        print(f"capstan bench failover failed: {exc}", file=sys.stderr, flush=True)
        raise
    finally:
        _stop_clients(sending, stops)
        cluster.stop()


def _stop_clients(sending: Sending | None, stops: list[Callable[[], None]]) -> None:
    """Stop the producer and every consumer, once."""
    if sending is not None:
        sending.stop()
    while stops:
        stops.pop()()


def _in_one_line(record: logging.LogRecord) -> bool:
    """A record's exception as one line at the end of its message, not as a traceback."""
    if record.exc_info and record.exc_info[1] is not None:
        error = " ".join(str(record.exc_info[1]).split())[:200]
        record.msg = f"{record.getMessage()}: {type(record.exc_info[1]).__name__} {error}"
        record.args = ()
        record.exc_info = None
        record.exc_text = None
    return True


def main(quick: bool = False, directory: str | None = None) -> None:
    repetitions = 3 if quick else 5
    # The clients' own warnings (each failed call, mid-fault) would bury the figures.
    logging.getLogger("capstan.client").setLevel(logging.ERROR)
    # The official clients' failed heartbeats mid-fault, each a traceback, in one line each.
    logging.getLogger("concurrent.futures").addFilter(_in_one_line)
    root = pathlib.Path(tempfile.mkdtemp(prefix="capstan-failover-bench-", dir=directory))
    print(
        f"capstan bench failover: {len(KINDS)} consumer kinds, {len(FAULTS)} faults, "
        f"{repetitions} times each, a line as each fault is healed (about"
        f" {repetitions * len(FAULTS) * FAULT_TYPICAL_S / 60:.0f} minutes on an idle machine)",
        flush=True,
    )
    try:
        figures = run(root, repetitions)
    except BaseException:
        # Whole logs, not the ends printed: what a failure here needs read.
        print(f"the processes' data and logs are kept in {root}", file=sys.stderr, flush=True)
        raise
    shutil.rmtree(root, ignore_errors=True)
    print()
    print("worst of the repetitions, seconds: resume (fault to the first message sent after")
    print("it consumed) / delay (longest acknowledgement-to-consumption around the fault)")
    width = max(20, 1 + max(len(f) for f in FAULTS))  # a column per fault
    print(f"{'kind':<17}" + "".join(f"{f:>{width}}" for f in FAULTS))
    for kind in KINDS:
        cells = "".join(
            f"{figures[f'{f}_{kind}_resume_s']:>{width - 11}.2f} /"
            f"{figures[f'{f}_{kind}_delay_s']:>7.2f}  "
            for f in FAULTS
        )
        print(f"{kind:<17}{cells}")
    for label, figure, digits in (
        ("send gap", "send_gap_s", 2),
        ("longest send", "longest_send_s", 2),
        ("failed sends", "failed_sends", 0),
    ):
        print(
            f"{label:<17}"
            + "".join(f"{figures[f'{f}_{figure}']:>{width}.{digits}f}" for f in FAULTS)
        )
    print()
    for kind in KINDS:
        lost, dup = figures[f"{kind}_lost"], figures[f"{kind}_duplicates"]
        print(f"{kind:<17} lost {lost:>5.0f}  duplicates {dup:>5.0f}")
    keys = [k for k in figures if k.endswith(("_resume_s", "_delay_s"))]
    figures["worst_resume_s"] = max(figures[k] for k in keys if k.endswith("_resume_s"))
    figures["worst_delay_s"] = max(figures[k] for k in keys if k.endswith("_delay_s"))
    figures["lost"] = sum(figures[f"{k}_lost"] for k in KINDS)
    print(
        f"of {figures['acknowledged']:.0f} acknowledged; worst resume "
        f"{figures['worst_resume_s']:.2f} s, worst delay {figures['worst_delay_s']:.2f} s "
        "(target <= 2 s, 0 lost)"
    )
    print(json.dumps({"bench": "failover", "quick": quick, "repetitions": repetitions, **figures}))
