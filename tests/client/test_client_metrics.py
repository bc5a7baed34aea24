"""The PushConsumer's Prometheus metrics as a user scrapes them: served over HTTP with
`prometheus_client.start_http_server(port, registry=consumer.metrics.registry)` while the
consumer pulls (long polling included), consumes, fails and sends back, and rebalances at
start, on its timer and when another member joins."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Sequence

from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families

from capstan.client.consumer.push_consumer import PushConsumer
from capstan.client.consumer.received_message import ReceivedMessage
from capstan.client.consumer.settings import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumerOptions,
    ConsumeStatus,
)
from tests.client.broker_calls import produce
from tests.client.test_push_consumer import Recorder
from tests.waiting import wait_until

LISTENER_S = 0.02


def scrape(consumer: PushConsumer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Serve the consumer's registry on a free port, GET /metrics once, stop serving;
    each sample by name and labels (the consumer's own two labels left out)."""
    server, thread = start_http_server(0, addr="127.0.0.1", registry=consumer.metrics.registry)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            assert reply.status == 200
            text = reply.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            own = {"consumer_group": consumer.group, "client_id": consumer.client_id}
            assert {k: s.labels[k] for k in own} == own, s
            rest = tuple(sorted((k, v) for k, v in s.labels.items() if k not in own))
            samples[s.name, rest] = s.value
    return samples


def idled_and_rebalanced(consumer: PushConsumer) -> bool:
    """A pull waited out its long poll (took over half a second) and the timer rebalanced."""
    get = consumer.metrics.registry.get_sample_value
    own = {"consumer_group": consumer.group, "client_id": consumer.client_id}
    pulls = get("capstan_pull_latency_seconds_count", own) or 0
    quick = get("capstan_pull_latency_seconds_bucket", {**own, "le": "0.5"}) or 0
    timer = get("capstan_rebalances_total", {**own, "trigger": "timer"}) or 0
    return quick < pulls and timer >= 1


def test_metrics_served_over_http_show_pulls_consumption_failures_and_rebalances(broker, names):
    topic, group = names
    produce(broker, topic, [f"ok{i}" for i in range(10)] + ["fail0", "fail1"])
    calls = 0
    lock = threading.Lock()

    def decide(batch: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        nonlocal calls
        with lock:
            calls += 1
        time.sleep(LISTENER_S)
        if batch[0].body.startswith(b"fail") and batch[0].reconsume_times == 0:
            ctx.delay_level_when_next_consume = 1
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    seen = Recorder(decide)
    options = ConsumerOptions(
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
        rebalance_interval_s=1.0,
        long_polling_ms=1000,
    )
    consumer = PushConsumer(broker.address, group, seen, options=options)
    consumer.subscribe(topic)
    other = PushConsumer(broker.address, group, Recorder(), options=options)
    other.subscribe(topic)
    with consumer:
        wait_until(lambda: len(seen.bodies()) >= 14, 20, "12 messages and 2 retries")
        wait_until(
            lambda: idled_and_rebalanced(consumer), 10, "an idle long poll and a timer rebalance"
        )
        with other:  # a member joins: the broker notifies, the consumer rebalances at once
            wait_until(
                lambda: consumer.metrics.registry.get_sample_value(
                    "capstan_rebalances_total",
                    {"consumer_group": group, "client_id": consumer.client_id, "trigger": "notify"},
                ),
                10,
                "a rebalance on notification",
            )
            got = scrape(consumer)

    def one(name: str, **labels: str) -> float:
        return got[name, tuple(sorted(labels.items()))]

    # Pulls: the 12 messages and their 2 retries were pulled; idle pulls wait out their
    # long poll (1 s), so some pulls took longer than half a second.
    assert one("capstan_pulled_messages_total") == 14
    pulls = one("capstan_pull_latency_seconds_count")
    assert pulls >= 5  # at least one per queue (4 + the retry queue)
    assert one("capstan_pull_latency_seconds_bucket", le="0.5") < pulls
    assert one("capstan_pull_latency_seconds_sum") >= 0.5
    # Consumption: one observation per listener call, each at least the listener's time.
    assert one("rocketmq_process_time_count") == calls == 14
    assert one("rocketmq_process_time_sum") >= LISTENER_S * calls
    assert one("rocketmq_process_time_bucket", le="0.01") == 0
    assert one("capstan_consumed_messages_total") == 12
    assert one("rocketmq_consume_failures_total") == 2
    assert one("capstan_send_back_total", result="ok") == 2
    # Rebalances by trigger: once at start, on the 1 s timer, on the join notification.
    assert one("capstan_rebalances_total", trigger="start") == 1
    assert one("capstan_rebalances_total", trigger="timer") >= 1
    assert one("capstan_rebalances_total", trigger="notify") >= 1
    assert one("capstan_queues_taken_total") == 5
