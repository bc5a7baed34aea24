"""A broker's heartbeat round tries the controller replicas in turn until one answers: an
unreachable one, or a follower replica's refusal, moves on to the next at once rather than a
beat later, so brokers find the leader quickly when every controller restarted together."""

from __future__ import annotations

import time
from pathlib import Path

import grpc

from tests.broker.broker_process import BrokerProcess, free_port
from tests.controller.controller_process import ControllerProcess
from tests.waiting import wait_until

BEAT_S = 3.0


def registered(controller: ControllerProcess) -> bool:
    try:
        return bool(controller.group("g").master_id == 1)
    except grpc.RpcError as exc:
        if exc.code() is grpc.StatusCode.NOT_FOUND:  # type: ignore[attr-defined]
            return False
        raise


def test_an_unreachable_first_controller_costs_no_beat(tmp_path: Path) -> None:
    controller = ControllerProcess(tmp_path / "controller", tmp_path / "state").start()
    (tmp_path / "b").mkdir()
    broker = BrokerProcess(
        tmp_path / "b",
        broker_name="g",
        replication={
            # The first replica listens nowhere: before, the next was tried a beat later.
            "controller_address": f"127.0.0.1:{free_port()},{controller.address}",
            "replicas": 1,
            "heartbeat_interval_ms": int(BEAT_S * 1000),
        },
    )
    try:
        broker.start()
        began = time.monotonic()
        wait_until(lambda: registered(controller), 10, "the broker registered")
        assert time.monotonic() - began < BEAT_S / 2
    finally:
        broker.stop()
        controller.stop()
