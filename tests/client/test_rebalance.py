"""Consumers in separate processes share a topic's queues and hand them over on join,
clean exit, kill -9 and SIGSTOP (silent, its streams still open), while a producer keeps
sending; nothing is lost and duplicates stay within what was consumed but not yet
committed. The members' periodic rebalance is an hour here: every hand-over must come
from the broker's member-change notification."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.client.admin import BlockingAdminClient
from capstan.v1 import consumer_pb2 as c
from capstan.v1 import consumer_pb2_grpc as c_grpc
from tests.broker.broker_process import BrokerProcess
from tests.broker.v2_requests import send, stub, v2_message
from tests.tiers import process_tool
from tests.waiting import wait_until

QUEUES = 8
PERSIST_INTERVAL_S = 1.0  # what tests/client/consumer_process.py configures
HEARTBEAT_INTERVAL_S = 1.0  # likewise
MEMBER_EXPIRY_S = 3.0
NO_TIMER = "rebalance_interval_s=3600"
"""Given to every member: a rebalance within the test can only be a notified one."""


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    (tmp_path / "broker").mkdir()
    groups = {"member_expiry_s": MEMBER_EXPIRY_S}
    process = BrokerProcess(tmp_path / "broker", consumer_groups=groups).start()
    process.create_topic("R", queues=QUEUES)
    process.create_group("RG")
    try:
        yield process
    finally:
        process.stop()


@process_tool
class ConsumerProcess:
    def __init__(
        self,
        broker: BrokerProcess,
        root: Path,
        name: str,
        orderly: bool = False,
        topic: str = "R",
    ) -> None:
        self.name = name
        self.out = root / f"{name}.txt"
        self.log = root / f"{name}.log"
        args = [broker.address, "RG", topic, str(self.out), name, NO_TIMER]
        if orderly:
            args.append("orderly")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("consumer_process.py")), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONSAFEPATH": "1"},
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(20) == 0, self.log.read_text()[-2000:]

    def kill9(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: no more heartbeats, but its connections (and WatchGroup stream) stay."""
        self.proc.send_signal(signal.SIGSTOP)

    def rebalances(self) -> dict[str, int]:
        """How many rebalances each trigger started, as the process printed on SIGTERM."""
        for row in self.log.read_text().splitlines():
            if row.startswith("rebalances "):
                return {k: int(v) for k, v in (p.split("=") for p in row.split()[1:])}
        raise AssertionError(f"{self.name} printed no rebalance counts")


def assert_only_notified_rebalances(consumers: list[ConsumerProcess]) -> None:
    """Each member rebalanced at start and then only when the broker told it to."""
    for cp in consumers:
        counts = cp.rebalances()
        assert counts["start"] == 1 and counts["timer"] == 0, (cp.name, counts)


@dataclass
class Line:
    client: str
    queue_id: int
    offset: int
    body: str
    at: float


def read_lines(consumers: list[ConsumerProcess]) -> list[Line]:
    lines = []
    for cp in consumers:
        if cp.out.exists():
            for row in cp.out.read_text().splitlines():
                parts = row.split(" ")
                if len(parts) == 5:  # a kill -9 may leave a torn last line
                    client, qid, offset, body, at = parts
                    lines.append(Line(client, int(qid), int(offset), body, float(at)))
    return lines


def consumed_by(consumers: list[ConsumerProcess], name: str) -> int:
    return sum(1 for line in read_lines(consumers) if line.client == name)


def consuming(consumers: list[ConsumerProcess], names: list[str]) -> None:
    """Wait until each of `names` has consumed more than it had (a hand-over under traffic)."""
    before = {name: consumed_by(consumers, name) for name in names}
    wait_until(
        lambda: all(consumed_by(consumers, name) > before[name] for name in names),
        30,
        f"{', '.join(names)} consuming",
    )


def ownership(address: str, topic: str = "R") -> dict[str, list[int]]:
    s = c_grpc.ConsumerStub(grpc.insecure_channel(address))  # type: ignore[no-untyped-call]
    members = s.GetMembers(c.GetMembersRequest(group="RG"), timeout=5).members
    return {m.client_id: sorted(q.queue_id for q in m.owned if q.topic == topic) for m in members}


# Seconds for consumer processes to start and join: 2 to 5 on an idle machine, over 30
# seen beside the e2e story's image builds. Not what these tests measure.
STARTUP_S = 90


def committed_offsets(address: str, topic: str = "R") -> dict[int, int]:
    """Queue id -> the offset group RG has committed on `topic`, as the broker holds it."""
    with BlockingAdminClient(address) as admin:
        offsets = admin.describe_group("RG").group.offsets
    return {o.queue_id: o.committed_offset for o in offsets if o.topic == topic}


def wait_member(address: str, name: str, timeout_s: float, topic: str = "R") -> None:
    deadline = time.monotonic() + timeout_s
    while name not in ownership(address, topic):
        assert time.monotonic() < deadline, f"{name} never joined"
        time.sleep(0.05)


def wait_balanced(address: str, names: list[str], timeout_s: float, topic: str = "R") -> float:
    """Seconds until exactly `names` are members and own disjoint, balanced shares of R."""
    start = time.monotonic()
    owned: dict[str, list[int]] = {}
    while time.monotonic() - start < timeout_s:
        owned = ownership(address, topic)
        shares = [owned.get(n, []) for n in names]
        flat = sorted(q for share in shares for q in share)
        sizes = sorted(len(s) for s in shares)
        balanced = sizes[-1] - sizes[0] <= 1
        if sorted(owned) == sorted(names) and flat == list(range(QUEUES)) and balanced:
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"never balanced over {names}: {owned}")


class Producer:
    """Sends "m<i>" messages until stopped; `sent` holds what was acknowledged."""

    def __init__(self, address: str) -> None:
        self._stub = stub(address)
        self.sent: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            body = f"m{i}"
            reply = send(self._stub, v2_message("R", body.encode()))
            assert reply.entries[0].status.code == 20000  # OK
            self.sent.append(body)
            i += 1
            time.sleep(0.002)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def test_members_share_queues_take_over_on_join_and_kill_and_lose_nothing(broker, tmp_path):
    producer = Producer(broker.address)
    first = [ConsumerProcess(broker, tmp_path, f"c{i}") for i in range(3)]
    consumers = list(first)
    try:
        wait_balanced(broker.address, ["c0", "c1", "c2"], STARTUP_S)
        # A fourth member joins: the others hear of it from the broker and give up queues
        # at once (their periodic rebalance is an hour away).
        joined_at = time.time()
        sent_at_join = len(producer.sent)
        consumers.append(ConsumerProcess(broker, tmp_path, "c3"))
        wait_member(broker.address, "c3", STARTUP_S)
        joined_in = wait_balanced(broker.address, ["c0", "c1", "c2", "c3"], 30)
        assert joined_in < 5, joined_in
        wait_until(
            lambda: consumed_by(consumers, "c3") and len(producer.sent) >= sent_at_join + 20,
            30,
            "the fourth member consuming",
        )
        # kill -9: its queues go to the others once the broker notices it is gone.
        victim = consumers[1]
        victim.kill9()
        committed_at_kill = committed_offsets(broker.address)  # before anyone takes over
        sent_at_kill = len(producer.sent)
        takeover = wait_balanced(broker.address, ["c0", "c2", "c3"], 20)
        assert takeover < 10, takeover
        deadline = time.monotonic() + 30
        while len(producer.sent) < sent_at_kill + 100:  # traffic after the takeover too
            assert time.monotonic() < deadline, "the producer stalled"
            time.sleep(0.1)
    finally:
        producer.stop()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            consumed = {line.body for line in read_lines(consumers)}
            if consumed >= set(producer.sent):
                break
            time.sleep(0.2)
    finally:
        for cp in consumers:
            if cp is not victim:
                cp.stop()
    assert_only_notified_rebalances([cp for cp in consumers if cp is not victim])
    lines = read_lines(consumers)
    missing = set(producer.sent) - {line.body for line in lines}
    assert not missing, f"{len(missing)} acknowledged messages never consumed"
    # Messages flowed before the join, between the join and the kill, and after it.
    assert sent_at_join > 0 and sent_at_kill - sent_at_join >= 20, (sent_at_join, sent_at_kill)
    # Duplicates: a message consumed twice was first consumed by a member that lost its
    # queue before committing: the killed one (past what it had committed when it died), or
    # one that handed the queue over in a rebalance while a batch was in flight (at most a
    # pull batch per queue moved).
    first_seen: dict[str, Line] = {}
    for line in sorted(lines, key=lambda line: line.at):
        first_seen.setdefault(line.body, line)
    counts = Counter(line.body for line in lines)
    duplicated = [first_seen[body] for body, n in counts.items() if n > 1]
    from_handover = [
        d for d in duplicated if d.client != "c1" or d.offset < committed_at_kill.get(d.queue_id, 0)
    ]
    for d in from_handover:
        # The new owner may read the committed offset before the old one commits its last.
        assert d.at >= joined_at - (PERSIST_INTERVAL_S + 2.0), d
    assert len(from_handover) <= 32 * QUEUES, len(from_handover)
    by_client = Counter(line.client for line in lines)
    assert all(by_client[f"c{i}"] > 0 for i in range(4)), by_client


def test_a_silent_member_is_expired_by_heartbeat_and_its_queues_taken_over(broker, tmp_path):
    """SIGSTOP, unlike kill -9, leaves the member's WatchGroup stream open: the broker only
    notices through the heartbeats it stops sending (member_expiry_s), then tells the others."""
    producer = Producer(broker.address)
    consumers = [ConsumerProcess(broker, tmp_path, f"c{i}") for i in range(3)]
    frozen = consumers[1]
    try:
        wait_balanced(broker.address, ["c0", "c1", "c2"], STARTUP_S)
        balanced_at = time.time()
        time.sleep(1.5)
        its_queues = set(ownership(broker.address)["c1"])
        frozen.freeze()
        stopped_at = time.time()
        takeover = wait_balanced(broker.address, ["c0", "c2"], MEMBER_EXPIRY_S + 20)
        assert frozen.proc.poll() is None  # stopped, not gone: its connections are open
        # Not before its heartbeats could have expired, and promptly after.
        assert takeover >= MEMBER_EXPIRY_S - HEARTBEAT_INTERVAL_S, takeover
        assert takeover < MEMBER_EXPIRY_S + 8, takeover
        assert "consumer c1 left group RG (its heartbeats stopped)" in broker.log.read_text()
        sent_at_takeover = len(producer.sent)
        deadline = time.monotonic() + 30
        while len(producer.sent) < sent_at_takeover + 100:
            assert time.monotonic() < deadline, "the producer stalled"
            time.sleep(0.1)
    finally:
        producer.stop()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if {line.body for line in read_lines(consumers)} >= set(producer.sent):
                break
            time.sleep(0.2)
    finally:
        frozen.kill9()
        for cp in consumers:
            cp.stop()
    assert_only_notified_rebalances([consumers[0], consumers[2]])
    lines = read_lines(consumers)
    missing = set(producer.sent) - {line.body for line in lines}
    assert not missing, f"{len(missing)} acknowledged messages never consumed"
    assert all(line.at < stopped_at + 0.5 for line in lines if line.client == "c1")
    taken_up = {line.queue_id for line in lines if line.client != "c1" and line.at > stopped_at}
    assert its_queues and its_queues <= taken_up, (its_queues, taken_up)
    first_seen: dict[str, Line] = {}
    for line in sorted(lines, key=lambda line: line.at):
        first_seen.setdefault(line.body, line)
    counts = Counter(line.body for line in lines)
    for body, n in counts.items():
        if n == 1:
            continue
        d = first_seen[body]
        if d.at <= balanced_at + 2.0:
            continue  # handed over while the three started, one after another
        # Otherwise only what the frozen one consumed but had not committed yet.
        assert d.client == "c1" and d.queue_id in its_queues, d
        assert d.at >= stopped_at - (PERSIST_INTERVAL_S + 2.0), d


def test_orderly_members_keep_each_message_groups_order_across_joins_and_leaves(broker, tmp_path):
    broker.create_topic("F", "FIFO", queues=QUEUES)
    keys = [f"k{n}" for n in range(16)]
    s = stub(broker.address)
    stop = threading.Event()
    sent: dict[str, int] = dict.fromkeys(keys, 0)

    def produce() -> None:
        while not stop.is_set():
            for key in keys:
                message = v2_message(
                    "F", f"{key}:{sent[key]}".encode(), message_type=pb.FIFO, message_group=key
                )
                assert send(s, message).entries[0].status.code == 20000
                sent[key] += 1
            time.sleep(0.01)

    sender = threading.Thread(target=produce, daemon=True)
    consumers = [
        ConsumerProcess(broker, tmp_path, f"o{i}", orderly=True, topic="F") for i in range(2)
    ]
    try:
        wait_balanced(broker.address, ["o0", "o1"], STARTUP_S, topic="F")
        sender.start()
        consuming(consumers, ["o0", "o1"])
        consumers.append(ConsumerProcess(broker, tmp_path, "o2", orderly=True, topic="F"))
        wait_member(broker.address, "o2", STARTUP_S, topic="F")
        wait_balanced(broker.address, ["o0", "o1", "o2"], 30, topic="F")
        consuming(consumers, ["o0", "o1", "o2"])
        consumers[0].stop()  # leaves cleanly: commits, then unlocks its queues
        wait_balanced(broker.address, ["o1", "o2"], 30, topic="F")
        consuming(consumers, ["o1", "o2"])
    finally:
        stop.set()
        sender.join(10)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            lines = read_lines(consumers)
            if len(lines) >= sum(sent.values()):
                break
            time.sleep(0.2)
    finally:
        for cp in consumers:
            cp.stop()
    assert_only_notified_rebalances(consumers)
    per_key: dict[str, list[tuple[float, int, str]]] = {}
    for line in read_lines(consumers):
        key, n = line.body.split(":")
        per_key.setdefault(key, []).append((line.at, int(n), line.client))
    for key in keys:
        seen = [n for _, n, _ in sorted(per_key[key])]
        # Exactly once and in order, across every hand-over.
        assert seen == list(range(sent[key])), (key, seen[:50])
    movers = {key for key, rows in per_key.items() if len({c for _, _, c in rows}) > 1}
    assert movers, "no message group changed consumer: the test did not exercise a hand-over"
