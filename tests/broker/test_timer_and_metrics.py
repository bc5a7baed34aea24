"""The timer survives a broker crash; /metrics, /healthz and /readyz answer as documented."""

from __future__ import annotations

import time
import urllib.request

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.broker.v2_requests import now_ms, receive, send, stub, v2_message
from tests.waiting import wait_until


@pytest.mark.chaos
def test_delayed_messages_survive_kill_9_and_arrive_on_time(broker):
    broker.create_topic("Later", kind="DELAY", queues=2)
    broker.create_group("G")
    s = stub(broker.address)
    due = now_ms() + 4000
    for i in range(5):
        reply = send(
            s,
            v2_message("Later", f"d{i}".encode(), message_type=pb.DELAY, delivery_timestamp_ms=due),
        )
        assert reply.status.code == pb.OK
    broker.kill9()
    broker.start()
    # On a loaded machine the restart can outlast the delay: then they are due at once.
    serving = now_ms()
    s = stub(broker.address)
    got = []
    deadline = time.monotonic() + 15
    while len(got) < 5 and time.monotonic() < deadline:
        _, messages = receive(s, "G", "Later", wait_ms=3000)
        got += [(m.body, now_ms()) for m in messages]
    assert sorted(body for body, _ in got) == [f"d{i}".encode() for i in range(5)]
    on_time = max(due, serving) + 1500
    assert all(due <= at < on_time for _, at in got), [(at - due, serving - due) for _, at in got]


def test_metrics_health_and_readiness(broker):
    broker.create_topic("T", queues=1)
    broker.create_group("G")
    s = stub(broker.address)
    for _ in range(3):
        send(s, v2_message("T", b"12345"))
    assert send(s, v2_message("Nowhere", b"x")).status.code == pb.TOPIC_NOT_FOUND
    receive(s, "G", "T", batch=1)
    with pytest.raises(grpc.RpcError) as refused:
        broker.create_topic("T", queues=1)
    assert refused.value.code() is grpc.StatusCode.ALREADY_EXISTS
    base = f"http://127.0.0.1:{broker.http_port}"
    with urllib.request.urlopen(f"{base}/healthz", timeout=5) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"{base}/readyz", timeout=5) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'rocketmq_messages_in_total{topic="T"} 3.0' in text
    assert 'rocketmq_throughput_in_total{topic="T"} 15.0' in text
    assert 'rocketmq_messages_out_total{topic="T"} 1.0' in text
    store = {
        line.split("{")[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(("rocketmq_storage_size{", "capstan_store_disk_"))
    }
    assert store["rocketmq_storage_size"] > 3 * 5  # three records, headers and all
    assert 0 < store["capstan_store_disk_used_ratio"] < 1
    assert store["capstan_store_disk_max_used_ratio"] == 0.75  # the default setting
    # What alerts watch is there at 0 before anything fails, so the first failure counts.
    assert 'rocketmq_send_to_dlq_messages_total{consumer_group="G"} 0.0' in text
    assert 'capstan_put_failures_total{status="FLUSH_DISK_TIMEOUT"} 0.0' in text
    # Every call is timed by its protocol, method and the code it answered with.
    timed = {
        line.split("{", 1)[1].split("}", 1)[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("rocketmq_rpc_latency_count{")
    }

    def count(protocol: str, method: str, code: int) -> float:
        key = f'protocol_type="{protocol}",request_code="{method}",response_code="{code}"'
        return timed.get(key, 0.0)

    assert count("grpc_v2", "SendMessage", pb.OK) == 3
    assert count("grpc_v2", "SendMessage", pb.TOPIC_NOT_FOUND) == 1
    assert count("grpc_v2", "ReceiveMessage", pb.OK) == 1
    assert count("capstan_v1", "CreateTopic", grpc.StatusCode.OK.value[0]) == 1
    assert count("capstan_v1", "CreateTopic", grpc.StatusCode.ALREADY_EXISTS.value[0]) == 1
    # Offsets are derived from the pop state every second; the one in flight is not consumed.
    wait_until(lambda: group_figures(base, "G") == (3.0, 1.0), 10, "lag 3 and 1 in flight")


def group_figures(base: str, group: str) -> tuple[float | None, float | None]:
    """The consumer lag and in-flight messages of `group` on /metrics (None: no line yet)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    label = f'consumer_group="{group}"'
    lag, inflight = (
        next((float(x.split()[-1]) for x in lines if x.startswith(name) and label in x), None)
        for name in ("rocketmq_consumer_lag_messages", "rocketmq_consumer_inflight_messages")
    )
    return lag, inflight


def test_metrics_count_the_clients_that_heartbeat(broker):
    """Client sessions live at the v2 edge; the broker's gauges still count them."""
    s = stub(broker.address)
    for client_id, client_type in (("p1", pb.PRODUCER), ("c1", pb.SIMPLE_CONSUMER)):
        s.Heartbeat(
            svc.HeartbeatRequest(client_type=client_type, group=pb.Resource(name="G")),
            metadata=(("x-mq-client-id", client_id),),
            timeout=5,
        )
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    counts = {
        line.split("{")[0]: line.rsplit(" ", 1)[1]
        for line in text.splitlines()
        if line.startswith(("rocketmq_producer_connections{", "rocketmq_consumer_connections{"))
    }
    assert counts == {
        "rocketmq_producer_connections": "1.0",
        "rocketmq_consumer_connections": "1.0",
    }


def test_sigterm_answers_suspended_long_polls_and_exits_promptly(broker):
    import threading

    broker.create_topic("Idle", queues=1)
    broker.create_group("G")
    s = stub(broker.address)
    outcome: list[object] = []

    def poll() -> None:
        try:
            outcome.append(receive(s, "G", "Idle", wait_ms=20_000)[0].code)
        except grpc.RpcError as exc:  # the stream cut by the stop also answers; a hang does not
            outcome.append(exc.code())

    thread = threading.Thread(target=poll)
    thread.start()
    base = f"http://127.0.0.1:{broker.http_port}"
    wait_until(lambda: suspended_polls(base) >= 1, 10, "the receive to wait at the broker")
    started = time.monotonic()
    assert broker.stop() == 0
    thread.join(10)
    assert outcome and time.monotonic() - started < 5
    assert outcome[0] in (pb.MESSAGE_NOT_FOUND, grpc.StatusCode.UNAVAILABLE), outcome


def test_sigterm_ends_open_telemetry_streams_instead_of_waiting_the_grace(tmp_path):
    """A client's Telemetry stream stays open for as long as the client runs: a stopping
    broker ends it (the client opens one on another broker) instead of holding its stop
    for the whole shutdown grace."""
    import queue
    import threading

    from tests.broker.broker_process import BrokerProcess

    broker = BrokerProcess(tmp_path, shutdown_grace_s=30).start()
    try:
        settings = pb.Settings(
            client_type=pb.PRODUCER,
            publishing=pb.Publishing(topics=[pb.Resource(name="Orders")]),
        )
        outbox: queue.Queue[svc.TelemetryCommand | None] = queue.Queue()
        outbox.put(svc.TelemetryCommand(settings=settings))

        def commands():
            while (command := outbox.get()) is not None:
                yield command

        stream = stub(broker.address).Telemetry(
            commands(), metadata=(("x-mq-client-id", "held-open"),), timeout=60
        )
        replies: list[object] = []

        def read() -> None:
            try:
                replies.extend(stream)
                replies.append(stream.code())
            except grpc.RpcError as exc:
                replies.append(exc.code())

        reader = threading.Thread(target=read)
        reader.start()
        wait_until(lambda: len(replies) >= 1, 10, "the broker's answer to the settings")
        started = time.monotonic()
        assert broker.stop() == 0
        took = time.monotonic() - started
        reader.join(10)
        outbox.put(None)
        assert took < 5, f"the stop waited {took:.1f} s for the client's stream"
        assert replies[-1] == grpc.StatusCode.OK, replies[-1]
    finally:
        broker.stop()


def suspended_polls(base: str) -> float:
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return sum(float(x.split()[-1]) for x in lines if x.startswith("capstan_long_polls_suspended"))
