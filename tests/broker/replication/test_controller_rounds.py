"""A broker's heartbeat round tries the controller replicas in turn until one answers: an
unreachable one, or a follower replica's refusal, moves on to the next at once rather than a
beat later, so brokers find the leader quickly when every controller restarted together;
and while none can be reached, rounds come a tenth of a second apart, so a controller that
is back hears at once from a slave whose master died meanwhile."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import grpc

from tests.broker.broker_process import BrokerProcess, free_port
from tests.broker.replication.test_controlled_group import start_cluster, stop_cluster
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


SLOW_BEAT_S = 4.0
"""Heartbeats far enough apart that a round an interval after a failed one comes seconds
after the controller is back (it listens about 0.4 s after it starts)."""


def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=0.2).close()
    except OSError:
        return False
    return True


def test_a_master_lost_while_its_controller_was_down_is_replaced_once_the_controller_is_back(
    tmp_path: Path,
) -> None:
    """Before, a round that found no controller waited a whole interval for the next, and
    the channel tried to connect again up to a second apart: a group whose master died
    while its controller restarted stayed without one for up to both after the controller
    was back (2.7 s of failed sends in `capstan bench failover`)."""
    cluster = start_cluster(
        tmp_path,
        controller={"broker_timeout_ms": 4 * int(SLOW_BEAT_S * 1000)},
        heartbeat_interval_ms=int(SLOW_BEAT_S * 1000),
    )
    try:
        master, slave = cluster.ready()
        (slave_id,) = [r.broker_id for r in cluster.info().replicas if r.address == slave.address]
        # The controller first, so the slave's report that its master's stream broke finds
        # no controller: only a round after the controller is back can elect.
        cluster.controller.kill9()
        master.kill9()
        time.sleep(1.0)
        cluster.controller.start()
        wait_until(lambda: _listening(cluster.controller.address), 20, "the controller to listen")
        back = time.monotonic()
        wait_until(lambda: cluster.info().master_id == slave_id, 20, "the slave elected")
        took = time.monotonic() - back
        assert took < 0.5, f"the slave was elected {took:.2f} s after the controller was back"
    finally:
        stop_cluster(cluster)
