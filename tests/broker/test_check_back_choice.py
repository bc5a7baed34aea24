"""Which connected producer a transaction check-back goes to: one publishing the half
message's topic (the official clients' producer group is the topic), and any other only
when asked for any."""

from __future__ import annotations

import asyncio

from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.broker.edge.v2.clients import ClientRegistry


def producer(registry: ClientRegistry, client_id: str, topics: list[str]) -> asyncio.Queue:
    settings = pb.Settings(
        client_type=pb.PRODUCER,
        publishing=pb.Publishing(topics=[pb.Resource(name=t) for t in topics]),
    )
    session = registry.apply_settings(client_id, settings)
    outbox: asyncio.Queue = asyncio.Queue()
    session.stream_opened(outbox)
    return outbox


def test_a_producer_of_the_topic_is_chosen_and_another_only_when_any_will_do() -> None:
    registry = ClientRegistry("127.0.0.1:8081")
    other = producer(registry, "other", ["Orders"])
    assert registry.producer_for("Pay", any_producer=False) is None
    assert registry.producer_for("Pay").client_id == "other"
    payer = producer(registry, "payer", ["Pay"])
    assert registry.producer_for("Pay", any_producer=False).client_id == "payer"
    assert registry.producer_for("Pay").client_id == "payer"
    assert other.empty() and payer.empty()


def test_a_producer_without_a_telemetry_stream_is_never_chosen() -> None:
    registry = ClientRegistry("127.0.0.1:8081")
    stream = producer(registry, "payer", ["Pay"])
    registry.get("payer").stream_closed(stream)
    registry.heartbeat("beating", pb.PRODUCER, "")
    assert registry.producer_for("Pay") is None


def test_a_producer_with_two_streams_is_reached_on_the_one_left_open() -> None:
    # The official clients open a stream per endpoint list; two may reach one broker.
    registry = ClientRegistry("127.0.0.1:8081")
    first = producer(registry, "payer", ["Pay"])
    second = producer(registry, "payer", ["Pay"])
    session = registry.get("payer")
    assert session.outbox is second  # the newest
    session.stream_closed(second)
    assert registry.producer_for("Pay", any_producer=False) is session
    assert session.outbox is first
    assert registry.expire(now=float("inf")) == []  # a stream is open: not forgotten
    session.stream_closed(first)
    assert registry.producer_for("Pay") is None
    assert registry.expire(now=float("inf")) == ["payer"]
