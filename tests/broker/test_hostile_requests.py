"""A flood of hostile calls to every method the broker serves: each is refused with its
gRPC code, the broker's log stays a few lines with no traceback, and sends and receives
keep working meanwhile."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.common.grpc_limits import MAX_MESSAGE_BYTES
from capstan.common.grpc_services import BROKER_SERVICES, REFLECTION
from tests.broker.v2_requests import ack, receive, send, stub, v2_message
from tests.hostile_calls import (
    REFUSED_OVERSIZED,
    call,
    one_per_service,
    oversized,
    payloads,
    served_methods,
    wrong_answer,
)

SEED = 25
EACH = 3
"""Random and truncated payloads per method (the broker serves about 50 methods)."""
CALL_TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def b(shared_broker):
    shared_broker.create_topic("Fuzz", queues=1)
    shared_broker.create_group("FuzzGroup")
    return shared_broker


def test_hostile_calls_are_refused_quietly_while_good_ones_are_served(b):
    methods = served_methods(b.address)
    assert {m.path.split("/")[1] for m in methods} == {*BROKER_SERVICES, REFLECTION}
    rng = random.Random(SEED)
    calls = [(m, p) for m in methods for p in payloads(m, rng, EACH)]
    log_before = b.log.read_text()
    with ThreadPoolExecutor(8) as pool, grpc.insecure_channel(b.address) as channel:
        answers = pool.map(lambda c: (c, call(channel, c[0], c[1].data, CALL_TIMEOUT_S)), calls)
        served = _send_and_receive(b.address)  # while the flood runs
        wrong = [wrong_answer(m, p, code) for (m, p), code in answers]
    assert [w for w in wrong if w] == []
    assert served and _send_and_receive(b.address)
    added = b.log.read_text()[len(log_before) :]
    assert "Traceback" not in added, added[-3000:]
    assert len(added.splitlines()) <= 2 * len(methods), added[-3000:]


def test_a_capstan_call_missing_its_names_is_refused_as_invalid_not_looked_up(b):
    """An empty request lacks every name: a lookup of nothing (NOT_FOUND) would blame a
    topic or group that nobody named."""
    methods = [m for m in served_methods(b.address) if m.path.startswith("/capstan.v1.")]
    with grpc.insecure_channel(b.address) as channel:
        codes = {m.path: call(channel, m, b"", CALL_TIMEOUT_S) for m in methods}
    assert {path for path, code in codes.items() if code is grpc.StatusCode.NOT_FOUND} == set()
    assert grpc.StatusCode.INVALID_ARGUMENT in codes.values()


def test_a_payload_over_the_size_limit_is_refused_as_resource_exhausted(b):
    methods = one_per_service(served_methods(b.address))
    too_big = oversized(MAX_MESSAGE_BYTES)
    log_before = b.log.read_text()
    with grpc.insecure_channel(b.address) as channel:
        codes = {name: call(channel, m, too_big.data, 60) for name, m in methods.items()}
    assert set(codes.values()) == {REFUSED_OVERSIZED}, codes
    added = b.log.read_text()[len(log_before) :]
    assert "Traceback" not in added and len(added.splitlines()) <= len(methods), added[-3000:]


def _send_and_receive(address: str) -> bool:
    """A send, a receive of it and its ack, over the v2 service as a client does them."""
    messaging = stub(address)
    sent = send(messaging, v2_message("Fuzz", b"good-" + str(time.monotonic()).encode()))
    if sent.status.code != pb.OK:
        return False
    status, messages = receive(messaging, "FuzzGroup", "Fuzz", invisible_ms=30_000)
    handles = [m.system_properties.receipt_handle for m in messages]
    acked = [ack(messaging, "FuzzGroup", "Fuzz", h).status.code for h in handles]
    return status.code == pb.OK and bool(messages) and set(acked) == {pb.OK}
