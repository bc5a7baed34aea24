"""A broker whose disk fills up, on a real full filesystem: a small tmpfs mounted under the
test's directory for its store (root only), filled with a file until ENOSPC.

Sends are refused as RocketMQ refuses them on a full store (INTERNAL_SERVER_ERROR, which the
official client raises as InternalErrorException) with a message saying the disk is full;
receives and topic changes answer a status too; the log holds no traceback; and once the
file is deleted the same broker stores and hands out messages again."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from rocketmq import Producer
from rocketmq.grpc_protocol import definition_pb2 as pb

from tests.broker.broker_process import TEST_SETTINGS, BrokerProcess
from tests.broker.test_official_client import config, message
from tests.broker.v2_requests import ack, receive, send, stub, v2_message
from tests.small_disk import mounted_small_disk

pytestmark = pytest.mark.chaos

DISK_BYTES = 24 * 1024 * 1024
BODY_BYTES = 1024 * 1024


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with mounted_small_disk(tmp_path / "data", DISK_BYTES) as disk:
        yield disk


@pytest.fixture
def broker(tmp_path: Path, small_disk: Path) -> Iterator[BrokerProcess]:
    # The disk watermark stays off: retention must not make room by deleting the test's data.
    store = {**TEST_SETTINGS["store"], "disk_max_used_ratio": 1.0}
    process = BrokerProcess(tmp_path, store=store).start()
    try:
        yield process
    finally:
        process.stop()


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
    return filler


def test_a_full_disk_is_answered_as_one_and_passes(broker, small_disk):
    broker.create_topic("Full", queues=1)
    broker.create_group("G")
    messaging = stub(broker.address)
    assert send(messaging, v2_message("Full", b"before")).status.code == pb.OK
    filler = fill(small_disk)

    refused = send_until_refused(broker)
    assert type(refused).__name__ == "InternalErrorException", refused
    assert "disk is full" in str(refused) and "Errno" not in str(refused), refused
    status, got = receive(messaging, "G", "Full", invisible_ms=1000)
    assert (status.code, got) == (pb.INTERNAL_SERVER_ERROR, []), status
    assert "disk is full" in status.message
    with pytest.raises(grpc.RpcError) as created:
        broker.create_topic("More")
    assert created.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "disk is full" in created.value.details()

    # The broker's own background work (transaction and timer progress, checkpoints,
    # offsets, the pop journal) meets the full disk too, over several of its rounds.
    time.sleep(3)
    filler.unlink()
    assert send(messaging, v2_message("Full", b"after")).status.code == pb.OK
    assert {b"before", b"after"} <= receive_bodies(messaging, {b"before", b"after"})
    broker.create_topic("More")
    log = broker.log.read_text()
    assert "Traceback" not in log, log[-3000:]


def send_until_refused(broker: BrokerProcess) -> Exception:
    """Send 1 MiB bodies with the official producer until one is refused (the segment in
    use fills, and the next cannot be made)."""
    producer = Producer(config(broker), ("Full",))
    producer.startup()
    try:
        for _ in range(2 * DISK_BYTES // BODY_BYTES):
            try:
                producer.send(message("Full", b"x" * BODY_BYTES))
            except Exception as exc:  # noqa: BLE001 - the refusal under test
                return exc
    finally:
        producer.shutdown()
    raise AssertionError("every send was stored on a full disk")


def receive_bodies(messaging: object, want: set[bytes], timeout_s: float = 15) -> set[bytes]:
    """Receive and ack until `want` came (what a failed receive took comes back after
    its invisible time) or `timeout_s` passed."""
    bodies: set[bytes] = set()
    deadline = time.monotonic() + timeout_s
    while not want <= bodies and time.monotonic() < deadline:
        status, got = receive(messaging, "G", "Full", invisible_ms=30_000, wait_ms=2000)
        assert status.code in (pb.OK, pb.MESSAGE_NOT_FOUND), status
        for m in got:
            handle = m.system_properties.receipt_handle
            assert ack(messaging, "G", "Full", handle).status.code == pb.OK
        bodies |= {m.body for m in got}
    return bodies
