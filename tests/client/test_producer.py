"""The SDK producer against real broker processes: what arrives, where, and what a failure
looks like. Messages are read back with the broker's capstan.v1 Pull API."""

from __future__ import annotations

import re
import subprocess
import threading
import time
import urllib.request
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials
from rocketmq import Producer as OfficialProducer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.client.channels import ChannelPool, new_client_id
from capstan.client.errors import (
    BrokerBusy,
    ClientError,
    RequestRefused,
    TopicNotFound,
    TransportError,
    from_exception,
    from_status,
)
from capstan.client.message import Message, MessageType, MessageView, SendReceipt
from capstan.client.producer import (
    ByKeyHash,
    DefaultSelector,
    Producer,
    RoundRobin,
    TransactionProducer,
    TransactionResolution,
    retry,
)
from capstan.client.route import RouteCache, RouteQueue
from capstan.v1 import pull_pb2 as v1
from capstan.v1 import pull_pb2_grpc as v1_grpc
from tests.broker.broker_process import BrokerProcess, free_port
from tests.broker.test_official_client import message as official_message

BODY_LIMIT = 1024
WAIT_S = 10.0
"""Upper bound of every wait for something to arrive."""


# -- brokers and reading back --------------------------------------------------------------


def start_brokers(root: Path, *names: str, **settings: object) -> list[BrokerProcess]:
    brokers = []
    for name in names:
        (root / name).mkdir()
        brokers.append(
            BrokerProcess(
                root / name, broker_name=name, max_message_body_bytes=BODY_LIMIT, **settings
            )
        )
    try:
        with ThreadPoolExecutor(len(brokers)) as pool:
            list(pool.map(lambda b: b.start(), brokers))
        for b in brokers:
            b.create_group("G")
    except BaseException:
        stop_all(brokers)
        raise
    return brokers


def stop_all(brokers: list[BrokerProcess]) -> None:
    """Stop every broker, even when stopping one of them fails."""
    failures = []
    for b in brokers:
        try:
            b.stop()
        except (OSError, subprocess.SubprocessError) as exc:
            failures.append(exc)
    if failures:
        raise failures[0]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, ...]]:
    """Brokers b1 and b2, shared by the tests that leave them running; each test uses
    its own topics."""
    brokers = start_brokers(tmp_path_factory.mktemp("pair"), "b1", "b2")
    try:
        yield tuple(brokers)
    finally:
        stop_all(brokers)


@pytest.fixture
def b1(pair: tuple[BrokerProcess, ...]) -> BrokerProcess:
    return pair[0]


def topic_on(brokers: tuple[BrokerProcess, ...] | list[BrokerProcess], name: str, **kw) -> str:
    for b in brokers:
        b.create_topic(name, **kw)
    return name


def pull_queue(broker: BrokerProcess, topic: str, queue_id: int) -> list[v1.PulledMessage]:
    stub = v1_grpc.PullStub(grpc.insecure_channel(broker.address))
    got: list[v1.PulledMessage] = []
    offset = 0
    while True:
        reply = stub.PullMessages(
            v1.PullMessagesRequest(
                group="G", topic=topic, queue_id=queue_id, offset=offset, max_messages=256
            ),
            timeout=10,
        )
        if reply.status != v1.FOUND:
            return got
        got.extend(reply.messages)
        offset = reply.next_begin_offset


def pull_topic(
    brokers: tuple[BrokerProcess, ...] | list[BrokerProcess], topic: str, queues: int
) -> dict[tuple[str, int], list[v1.PulledMessage]]:
    """Every stored message of the topic, by (broker name, queue id)."""
    out = {}
    for b in brokers:
        name = b.root.name
        for q in range(queues):
            out[name, q] = pull_queue(b, topic, q)
    return out


def bodies_where(stored: dict[tuple[str, int], list[v1.PulledMessage]]) -> dict[bytes, tuple]:
    return {m.body: where for where, ms in stored.items() for m in ms}


def wait_for(predicate, timeout_s: float = WAIT_S, every_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    return predicate()


def send_count(broker: BrokerProcess, code: int) -> float:
    """SendMessage calls the broker answered with `code`, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if (
            line.startswith("rocketmq_rpc_latency_count{")
            and 'request_code="SendMessage"' in line
            and f'response_code="{code}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


# -- sending, and what arrives ---------------------------------------------------------------


def test_a_sync_send_arrives_with_its_body_tag_keys_and_properties(b1):
    topic = topic_on([b1], "Plain", queues=4)
    message = Message(
        topic, b"hello", tag="greeting", keys=["order-1", "user-7"], properties={"region": "eu"}
    )
    with Producer(b1.address) as producer:
        receipt = producer.send(message)

    assert (receipt.topic, receipt.broker_name) == (topic, "b1")
    assert re.fullmatch(r"01[0-9A-F]{32}", receipt.message_id)
    assert receipt.transaction_id is None
    stored = pull_topic([b1], topic, 4)
    [(where, [got])] = [(w, ms) for w, ms in stored.items() if ms]
    assert got.message_id == receipt.message_id and got.queue_offset == receipt.offset
    assert got.body == b"hello"
    assert got.properties["TAGS"] == "greeting"
    assert got.properties["KEYS"] == "order-1 user-7"
    assert got.properties["region"] == "eu"
    assert receipt.queue_id in (None, where[1])


def test_async_and_oneway_sends_arrive_and_async_callbacks_run(b1):
    topic = topic_on([b1], "Async", queues=2)
    called = []
    with Producer(b1.address) as producer:
        futures = [producer.send_async(Message(topic, f"a{i}".encode())) for i in range(20)]
        for f in futures:
            f.add_done_callback(lambda f: called.append(f.result().message_id))
        for i in range(5):
            producer.send_oneway(Message(topic, f"o{i}".encode()))
        _, pending = wait(futures, timeout=WAIT_S)
        assert not pending
        receipts = [f.result() for f in futures]
    assert len({r.message_id for r in receipts}) == 20
    assert sorted(called) == sorted(r.message_id for r in receipts)
    want = {f"a{i}".encode() for i in range(20)} | {f"o{i}".encode() for i in range(5)}
    arrived = wait_for(lambda: set(bodies_where(pull_topic([b1], topic, 2))) == want)
    assert arrived


def test_a_batch_is_one_request_stored_in_order(b1):
    topic = topic_on([b1], "Batch", queues=1)
    with Producer(b1.address) as producer:
        receipts = producer.send_batch([Message(topic, f"m{i}".encode()) for i in range(10)])
    assert [r.offset for r in receipts] == list(range(10))
    assert [m.body for m in pull_queue(b1, topic, 0)] == [f"m{i}".encode() for i in range(10)]
    assert [m.message_id for m in pull_queue(b1, topic, 0)] == [r.message_id for r in receipts]


def test_a_batch_lands_in_one_queue_of_many(b1):
    topic = topic_on([b1], "BatchMany", queues=4)
    with Producer(b1.address) as producer:
        receipts = producer.send_batch([Message(topic, f"m{i}".encode()) for i in range(8)])
    used = {where for where, ms in pull_topic([b1], topic, 4).items() if ms}
    assert len(used) == 1
    assert {("b1", r.queue_id) for r in receipts} == used


def test_round_robin_spreads_sends_over_every_broker_and_queue(pair):
    topic = topic_on(pair, "Spread", queues=2)
    rr = RoundRobin()
    with Producer([b.address for b in pair]) as producer:
        receipts = [producer.send(Message(topic, f"m{i}".encode()), rr) for i in range(8)]
        receipts += [producer.send(Message(topic, f"d{i}".encode())) for i in range(8)]
    per_broker = {name: sum(r.broker_name == name for r in receipts) for name in ("b1", "b2")}
    assert per_broker == {"b1": 8, "b2": 8}
    stored = pull_topic(pair, topic, 2)
    assert all(len(ms) == 4 for ms in stored.values()), {w: len(ms) for w, ms in stored.items()}


def test_by_key_hash_sends_one_key_to_one_broker_group(pair):
    topic = topic_on(pair, "Keyed", queues=2)
    addresses = [b.address for b in pair]
    with Producer(addresses) as producer:
        queues = producer.routes.write_queues(topic)
        receipts: dict[str, list[SendReceipt]] = {}
        for round_ in range(4):
            for k in range(6):
                m = Message(topic, f"{k}-{round_}".encode(), keys=[f"key{k}"])
                receipts.setdefault(f"key{k}", []).append(producer.send(m, ByKeyHash()))
    for key, rs in receipts.items():
        expected = queues[zlib.crc32(key.encode()) % len(queues)].broker_name
        assert {r.broker_name for r in rs} == {expected}


def test_by_key_hash_sends_one_key_to_one_queue(b1):
    topic = topic_on([b1], "KeyedQueue", queues=4)
    with Producer(b1.address) as producer:
        for i in range(8):
            producer.send(Message(topic, f"{i}".encode(), keys=["same"]), ByKeyHash())
    used = {where for where, ms in pull_topic([b1], topic, 4).items() if ms}
    assert len(used) == 1


def test_keyed_messages_of_a_compact_topic_go_to_their_keys_queue_across_groups(pair):
    topic = topic_on(pair, "Compacted", queues=2, compact=True)
    plain = topic_on(pair, "NotCompacted", queues=2)
    addresses = [b.address for b in pair]
    sent: dict[bytes, str] = {}
    with Producer(addresses) as producer:
        queues = producer.routes.write_queues(topic)
        assert [q.by_key for q in queues] == [True] * 4
        assert not any(q.by_key for q in producer.routes.write_queues(plain))
        for round_ in range(3):
            for k in range(8):
                body = f"{k}-{round_}".encode()
                producer.send(Message(topic, body, keys=[f"key{k}"]))
                producer.send(Message(plain, body, keys=["same"]))
                sent[body] = f"key{k}"
    # Every record of a key in the one queue its key hashes to, over both groups' queues.
    where = bodies_where(pull_topic(pair, topic, 2))
    for body, key in sent.items():
        q = queues[zlib.crc32(key.encode()) % len(queues)]
        assert where[body] == (q.broker_name, q.queue_id), key
    assert len(set(where.values())) > 1
    # A topic that is not compact spreads keyed messages as any others.
    assert len(set(bodies_where(pull_topic(pair, plain, 2)).values())) == 4


def test_the_broker_sends_a_keyed_message_of_a_compact_topic_to_its_keys_queue(b1):
    # The official client names no queue: the broker picks the key's queue itself.
    topic = topic_on([b1], "CompactedOfficial", queues=4, compact=True)
    config = ClientConfiguration(b1.address, Credentials(), request_timeout=5)
    official = OfficialProducer(config, (topic,))
    official.startup()
    try:
        for round_ in range(3):
            for k in range(6):
                m = official_message(topic, f"{k}-{round_}".encode())
                m.keys = f"key{k}"
                official.send(m)
    finally:
        official.shutdown()
    placed = bodies_where(pull_topic([b1], topic, 4))
    assert len(placed) == 18, sorted(placed)
    for body, (_, queue_id) in placed.items():
        key = f"key{body.decode().split('-')[0]}"
        assert queue_id == zlib.crc32(key.encode()) % 4, key


def test_a_custom_function_selector_is_used(pair):
    topic = topic_on(pair, "Custom", queues=2)
    chosen: list[RouteQueue] = []

    def last_of_b2(queues: list[RouteQueue], message: Message) -> RouteQueue:
        chosen.append([q for q in queues if q.broker_name == "b2"][-1])
        return chosen[-1]

    with Producer([b.address for b in pair]) as producer:
        receipts = [producer.send(Message(topic, b"x"), last_of_b2) for _ in range(3)]
    assert {r.broker_name for r in receipts} == {"b2"} and len(chosen) == 3


def test_a_message_group_lands_on_one_queue_in_order(pair):
    topic = topic_on(pair, "Fifo", kind="FIFO", queues=4)
    groups = [f"order-{g}" for g in range(5)]
    with Producer([b.address for b in pair]) as producer:
        for i in range(8):
            for g in groups:
                producer.send(Message(topic, f"{g}/{i}".encode(), message_group=g))
    stored = pull_topic(pair, topic, 4)
    for g in groups:
        places = {
            where: [m.body for m in ms if m.body.startswith(f"{g}/".encode())]
            for where, ms in stored.items()
        }
        places = {w: bodies for w, bodies in places.items() if bodies}
        assert len(places) == 1, places
        [bodies] = places.values()
        assert bodies == [f"{g}/{i}".encode() for i in range(8)]


def test_a_delay_message_is_not_readable_before_its_time(b1):
    topic = topic_on([b1], "Later", kind="DELAY", queues=1)
    deliver_at = time.time_ns() // 1_000_000 + 1500
    with Producer(b1.address) as producer:
        producer.send(Message(topic, b"later", delivery_timestamp_ms=deliver_at))
    assert pull_queue(b1, topic, 0) == []
    arrived = wait_for(lambda: pull_queue(b1, topic, 0), every_s=0.05)
    seen_at = time.time_ns() // 1_000_000
    assert [m.body for m in arrived] == [b"later"]
    assert seen_at >= deliver_at - 50
    assert arrived[0].store_timestamp_ms >= deliver_at - 50


# -- transactions ----------------------------------------------------------------------------


class Checker:
    def __init__(self, answer: TransactionResolution) -> None:
        self.answer = answer
        self.asked: list[MessageView] = []
        self.asked_at: list[float] = []

    def __call__(self, view: MessageView) -> TransactionResolution:
        self.asked.append(view)
        self.asked_at.append(time.monotonic())
        return self.answer


def test_commit_shows_rollback_discards_and_unknown_is_decided_by_check_back(b1):
    topic = topic_on([b1], "Pay", kind="TRANSACTION", queues=1)
    checker = Checker(TransactionResolution.COMMIT)

    def decide(answer: TransactionResolution):
        return lambda message, receipt, arg: answer

    def fail(message, receipt, arg):
        raise RuntimeError("local transaction crashed")

    with TransactionProducer(b1.address, checker=checker, topics=[topic]) as producer:
        committed, r1 = producer.send_in_transaction(
            Message(topic, b"commit", tag="t"), decide(TransactionResolution.COMMIT)
        )
        rolled_back, r2 = producer.send_in_transaction(
            Message(topic, b"rollback"), decide(TransactionResolution.ROLLBACK)
        )
        unknown, r3 = producer.send_in_transaction(Message(topic, b"unknown"), fail)
        assert (r1, r2, r3) == (
            TransactionResolution.COMMIT,
            TransactionResolution.ROLLBACK,
            TransactionResolution.UNKNOWN,
        )
        assert all(r.transaction_id for r in (committed, rolled_back, unknown))
        assert wait_for(lambda: [m.body for m in pull_queue(b1, topic, 0)] == [b"commit"], 3)
        # Undecided: the broker asks after its 1 s check timeout; the checker commits.
        arrived = wait_for(lambda: len(pull_queue(b1, topic, 0)) == 2)
        assert arrived, "the check-back did not commit the undecided message"
    stored = pull_queue(b1, topic, 0)
    assert [m.body for m in stored] == [b"commit", b"unknown"]
    assert [m.message_id for m in stored] == [committed.message_id, unknown.message_id]
    assert {v.message_id for v in checker.asked} == {unknown.message_id}
    assert checker.asked[0].body == b"unknown" and checker.asked[0].topic == topic


def test_a_transaction_producer_reconnects_its_telemetry_and_answers_after_a_restart(
    tmp_path: Path,
):
    # Enough checks that some may fall while the broker is down or the stream reconnects.
    checks = {"check_timeout_ms": 1000, "check_interval_ms": 500, "max_checks": 40}
    [broker] = start_brokers(tmp_path, "r1", transaction=checks)
    try:
        topic = topic_on([broker], "Restart", kind="TRANSACTION", queues=1)
        checker = Checker(TransactionResolution.COMMIT)
        with TransactionProducer(broker.address, checker=checker) as producer:
            receipt, _ = producer.send_in_transaction(
                Message(topic, b"survives"), lambda m, r, a: TransactionResolution.UNKNOWN
            )
            broker.kill9()  # at once: no check-back can reach the old process
            restarted_at = time.monotonic()
            broker.start()
            assert wait_for(lambda: pull_queue(broker, topic, 0), 15)
        assert [v.message_id for v in checker.asked][:1] == [receipt.message_id]
        assert min(checker.asked_at) > restarted_at
    finally:
        broker.stop()


# -- failures --------------------------------------------------------------------------------


def test_sends_move_to_another_broker_group_when_one_dies(tmp_path: Path):
    brokers = start_brokers(tmp_path, "c1", "c2")
    try:
        topic = topic_on(brokers, "Failover", queues=2)
        fifo = topic_on(brokers, "FailoverFifo", kind="FIFO", queues=2)
        with Producer([b.address for b in brokers]) as producer:
            before = [producer.send(Message(topic, f"before{i}".encode())) for i in range(4)]
            assert {r.broker_name for r in before} == {"c1", "c2"}
            fifo_queues = producer.routes.write_queues(fifo)
            on_c1 = next(
                g
                for g in (f"group{i}" for i in range(100))
                if fifo_queues[zlib.crc32(g.encode()) % 4].broker_name == "c1"
            )
            brokers[0].kill9()
            # A message group stays on its queue: retried there, never moved to c2.
            with pytest.raises(TransportError) as caught:
                producer.send(Message(fifo, b"ordered", message_group=on_c1))
            assert caught.value.retriable and caught.value.attempts == 3
            assert not any(pull_topic(brokers[1:], fifo, 2).values())
            after = []
            for i in range(8):
                started = time.monotonic()
                after.append(producer.send(Message(topic, f"after{i}".encode())))
                assert time.monotonic() - started < 3
        assert {r.broker_name for r in after} == {"c2"}
        stored = bodies_where(pull_topic(brokers[1:], topic, 2))
        assert {f"after{i}".encode() for i in range(8)} <= set(stored)
    finally:
        stop_all(brokers)


def test_a_refused_send_raises_at_once_and_is_tried_once(b1):
    topic = topic_on([b1], "Strict", queues=2)
    with Producer(b1.address, max_attempts=3) as producer:
        too_large_before = send_count(b1, pb.MESSAGE_BODY_TOO_LARGE)
        with pytest.raises(RequestRefused) as caught:
            producer.send(Message(topic, b"x" * (BODY_LIMIT + 1)))
        assert caught.value.code == "MESSAGE_BODY_TOO_LARGE"
        assert caught.value.retriable is False and caught.value.attempts == 1
        assert send_count(b1, pb.MESSAGE_BODY_TOO_LARGE) == too_large_before + 1

        wrong_type_before = send_count(b1, pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)
        delayed = Message(topic, b"x", delivery_timestamp_ms=time.time_ns() // 1_000_000)
        with pytest.raises(RequestRefused) as caught:
            producer.send(delayed)
        assert caught.value.code == "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"
        assert (caught.value.retriable, caught.value.attempts) == (False, 1)
        assert send_count(b1, pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE) == wrong_type_before + 1

        future = producer.send_async(Message(topic, b"y" * (BODY_LIMIT + 1)))
        assert isinstance(future.exception(timeout=WAIT_S), RequestRefused)


def test_an_unknown_topic_is_topic_not_found_and_not_retriable(pair):
    with Producer([b.address for b in pair]) as producer:
        with pytest.raises(TopicNotFound) as caught:
            producer.send(Message("NoSuchTopic", b"x"))
        assert caught.value.retriable is False and caught.value.attempts == 1
        error = producer.send_async(Message("NoSuchTopic", b"x")).exception(timeout=WAIT_S)
        assert isinstance(error, TopicNotFound)


def test_no_broker_reachable_is_a_retriable_transport_error():
    dead = f"127.0.0.1:{free_port()}"
    with Producer(dead, max_attempts=2) as producer:
        started = time.monotonic()
        with pytest.raises(TransportError) as caught:
            producer.send(Message("T", b"x"))
        assert caught.value.retriable is True and caught.value.attempts == 2
        assert time.monotonic() - started < 5


def test_a_producer_sends_only_while_started(b1):
    producer = Producer(b1.address)
    with pytest.raises(RuntimeError, match="not started"):
        producer.send(Message("Plain", b"x"))
    producer.start()
    producer.shutdown()
    with pytest.raises(RuntimeError, match="not started"):
        producer.send_async(Message("Plain", b"x"))


# -- routes ----------------------------------------------------------------------------------


def test_a_route_is_the_union_of_every_endpoint_that_answers(pair):
    topic = topic_on(pair, "Union", queues=3)
    dead = f"127.0.0.1:{free_port()}"
    channels = ChannelPool()
    try:
        routes = RouteCache([pair[0].address, dead, pair[1].address], channels, new_client_id())
        queues = routes.queues(topic)
        assert [(q.broker_name, q.queue_id) for q in queues] == [
            (b, i) for b in ("b1", "b2") for i in range(3)
        ]
        assert {q.address for q in queues} == {b.address for b in pair}
        assert all(q.readable and q.writable for q in queues)
        assert all(q.accepted_types == frozenset({MessageType.NORMAL}) for q in queues)
        assert routes.write_queues(topic) == routes.read_queues(topic) == queues
        # The same broker through two endpoints is listed once.
        twice = RouteCache([pair[0].address, pair[0].address], channels, "c")
        assert len(twice.queues(topic)) == 3

        only_on_b2 = topic_on(pair[1:], "OnlyB2", queues=1)
        assert [q.broker_name for q in routes.queues(only_on_b2)] == ["b2"]
        with pytest.raises(TopicNotFound):
            RouteCache([b.address for b in pair], channels, "c").queues("Nowhere")
        with pytest.raises(TransportError):  # the endpoint that is down might know it
            routes.queues("Nowhere")
    finally:
        channels.close()


def test_the_route_cache_answers_from_cache_and_refreshes_in_the_background(pair):
    topic = topic_on(pair[:1], "Grows", queues=1)
    channels = ChannelPool()
    routes = RouteCache([b.address for b in pair], channels, new_client_id(), refresh_s=0.2)
    try:
        assert [q.broker_name for q in routes.queues(topic)] == ["b1"]
        topic_on(pair[1:], topic, queues=1)
        assert [q.broker_name for q in routes.queues(topic)] == ["b1"]  # cached
        routes.start()
        assert wait_for(lambda: len(routes.queues(topic)) == 2, 5)
        routes.invalidate(topic)
        assert routes.cached(topic) is None
    finally:
        routes.stop()
        channels.close()


# -- pure parts ------------------------------------------------------------------------------


def rq(broker: str, qid: int) -> RouteQueue:
    return RouteQueue(
        "T", broker, qid, (f"{broker}:1",), True, True, frozenset({MessageType.NORMAL})
    )


def test_retries_leave_out_failed_broker_groups_until_none_is_left():
    queues = [rq("a", 0), rq("a", 1), rq("b", 0), rq("c", 0)]
    assert retry.queues_for_attempt(queues, set()) == queues
    assert retry.queues_for_attempt(queues, {"a"}) == [rq("b", 0), rq("c", 0)]
    assert retry.queues_for_attempt(queues, {"a", "b"}) == [rq("c", 0)]
    assert retry.queues_for_attempt(queues, {"a", "b", "c"}) == queues
    assert retry.should_retry(True, 1, 3) and retry.should_retry(True, 2, 3)
    assert not retry.should_retry(True, 3, 3) and not retry.should_retry(False, 1, 3)
    assert retry.backoff_s(1, same_broker=False) == 0
    assert [retry.backoff_s(n, same_broker=True) for n in (1, 2, 3)] == [0.01, 0.02, 0.04]
    assert retry.backoff_s(20, same_broker=True) == retry.MAX_BACKOFF_S


def test_selectors():
    queues = [rq("a", 0), rq("a", 1), rq("b", 0), rq("b", 1)]
    rr = RoundRobin()
    picked = [rr.select(queues, Message("T", b"x")) for _ in range(8)]
    assert picked[:4] == picked[4:] and sorted(picked[:4], key=queues.index) == queues

    by_key = ByKeyHash()
    m = Message("T", b"x", keys=["k1", "k2"])
    assert by_key.select(queues, m) == queues[zlib.crc32(b"k1") % 4]
    assert {by_key.select(queues, m) for _ in range(10)} == {queues[zlib.crc32(b"k1") % 4]}
    tenant = ByKeyHash(key_fn=lambda m: m.properties.get("tenant"))
    assert (
        tenant.select(queues, Message("T", b"x", properties={"tenant": "acme"}))
        == queues[zlib.crc32(b"acme") % 4]
    )
    assert tenant.select(queues, Message("T", b"x")) in queues  # no key: round robin

    default = DefaultSelector()
    fifo = Message("T", b"x", message_group="g7")
    assert {default.select(queues, fifo) for _ in range(5)} == {queues[zlib.crc32(b"g7") % 4]}
    assert len({default.select(queues, Message("T", b"x")) for _ in range(4)}) == 4


def test_messages_are_checked_when_built():
    with pytest.raises(ValueError, match="topic"):
        Message("", b"x")
    with pytest.raises(ValueError, match="body"):
        Message("T", b"")
    with pytest.raises(TypeError, match="bytes"):
        Message("T", "text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tag"):
        Message("T", b"x", tag="a||b")
    with pytest.raises(ValueError, match="key"):
        Message("T", b"x", keys=["has space"])
    with pytest.raises(ValueError, match="not both"):
        Message("T", b"x", message_group="g", delivery_timestamp_ms=1)
    assert Message("T", b"x", message_group="g").message_type is MessageType.FIFO
    assert Message("T", b"x", delivery_timestamp_ms=1).message_type is MessageType.DELAY
    assert Message("T", b"x").message_type is MessageType.NORMAL


def test_errors_say_whether_a_retry_helps():
    def refused(code: int) -> ClientError:
        return from_status(pb.Status(code=code, message="no"))

    for code in (pb.TOO_MANY_REQUESTS, pb.MASTER_PERSISTENCE_TIMEOUT, pb.HA_NOT_AVAILABLE):
        assert isinstance(refused(code), BrokerBusy) and refused(code).retriable
    for code in (pb.BAD_REQUEST, pb.ILLEGAL_MESSAGE_TAG, pb.FORBIDDEN, pb.MESSAGE_BODY_TOO_LARGE):
        assert isinstance(refused(code), RequestRefused) and not refused(code).retriable
    assert isinstance(refused(pb.TOPIC_NOT_FOUND), TopicNotFound)
    assert refused(pb.ILLEGAL_MESSAGE_TAG).code == "ILLEGAL_MESSAGE_TAG"
    assert from_exception(ConnectionResetError("reset")).retriable
    channel = grpc.insecure_channel(f"127.0.0.1:{free_port()}")
    try:
        from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

        with pytest.raises(grpc.RpcError) as caught:
            svc_grpc.MessagingServiceStub(channel).QueryRoute(svc.QueryRouteRequest(), timeout=2)
        error = from_exception(caught.value)
        assert isinstance(error, TransportError) and error.code == "UNAVAILABLE"
    finally:
        channel.close()


def test_client_ids_are_unique():
    ids = set()
    lock = threading.Lock()

    def make() -> None:
        for _ in range(100):
            with lock:
                ids.add(new_client_id())

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 400
    assert all(len(i.split("@")) == 4 for i in ids)
