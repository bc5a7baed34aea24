"""A rolling restart of a 3-replica group under the official client's sends, as Kubernetes
does one on every update: each broker gets SIGTERM, stops and starts again, slaves first,
then the master. A master told to stop hands its leadership to a caught-up SyncStateSet
member before it stops, so sends fail for a moment at most, not for the time the
controller needs to notice a silent master (10 s here)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer

from tests.broker.broker_process import BrokerProcess
from tests.broker.replication.test_controlled_group import Cluster, start_cluster, stop_cluster
from tests.broker.test_official_client import message, receive_all
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

# Long enough that a master found dead by missed heartbeats would show as a 10 s outage.
BROKER_TIMEOUT_MS = 10_000


@dataclass
class SendLog:
    """Every send's outcome, in order: (monotonic time, body, acknowledged)."""

    sends: list[tuple[float, bytes, bool]] = field(default_factory=list)

    @property
    def acked(self) -> list[bytes]:
        return [body for _, body, ok in self.sends if ok]

    @property
    def failed(self) -> int:
        return sum(1 for _, _, ok in self.sends if not ok)

    def outages(self) -> list[tuple[float, float]]:
        """(start, length in s) of each stretch of failed sends: from the last acknowledged
        send before it to the first acknowledged one after it (or the last send)."""
        found, last_ok, failing = [], None, False
        for at, _, ok in self.sends:
            if not ok:
                failing = True
            elif failing and last_ok is not None:
                found.append((last_ok, at - last_ok))
                failing = False
            if ok:
                last_ok = at
        if failing and self.sends:  # still failing at the end: up to the last send
            start = last_ok if last_ok is not None else self.sends[0][0]
            found.append((start, self.sends[-1][0] - start))
        return found

    def longest_outage_s(self) -> float:
        return max((length for _, length in self.outages()), default=0.0)


def send_until(producer: Producer, stop: threading.Event, log: SendLog) -> None:
    i = 0
    while not stop.is_set():
        body = f"m-{i}".encode()
        i += 1
        try:
            producer.send(message("T", body))
            ok = True
        except Exception:  # noqa: BLE001 - the client raises its own error types
            ok = False
        log.sends.append((time.monotonic(), body, ok))
        time.sleep(0.01)


def restart(cluster: Cluster, broker: BrokerProcess) -> None:
    assert broker.stop() == 0
    broker.start()
    wait_until(lambda: cluster.settled(3), 30, "the restarted broker back in the SyncStateSet")


def test_a_rolling_restart_hands_the_master_over_and_loses_nothing(tmp_path: Path):
    cluster = start_cluster(
        tmp_path, replicas=3, controller={"broker_timeout_ms": BROKER_TIMEOUT_MS}
    )
    log, stop = SendLog(), threading.Event()
    try:
        master, _ = cluster.ready()
        first_epoch = cluster.info().master_epoch
        slaves = [b for b in cluster.brokers if b is not master]
        config = ClientConfiguration(cluster.controller.address, Credentials(), request_timeout=3)
        producer = Producer(config, ("T",))
        producer.startup()
        sender = threading.Thread(target=send_until, args=(producer, stop, log))
        sender.start()
        try:
            wait_until(lambda: len(log.acked) >= 20, 20, "sends before the restarts")
            for broker in [*slaves, master]:
                restart(cluster, broker)
                at = len(log.sends)
                wait_until(lambda at=at: len(log.acked) > at + 20, 20, "sends after a restart")
        finally:
            stop.set()
            sender.join(30)
            producer.shutdown()
        info = cluster.info()
        assert info.master_id != 0 and cluster.master() is not master
        assert info.master_epoch == first_epoch + 1  # one handover, no other election
        outage = log.longest_outage_s()
        assert outage < 3.0, f"{log.failed} sends failed; outages (start, s): {log.outages()}"
        consumer = SimpleConsumer(config, "G", {"T": FilterExpression("*")}, await_duration=2)
        consumer.startup()
        try:
            got = {m.body for m in receive_all(consumer, len(log.acked), timeout_s=30)}
        finally:
            consumer.shutdown()
        assert set(log.acked) <= got
    finally:
        stop.set()
        stop_cluster(cluster)
