"""Transactions in doubt when the master goes, with the official client's checker.

A producer sends transactional messages and decides none of them; then the master is
killed -9. Whoever serves the master's duties next (a slave the controller elects, or a
slave acting for a master that is gone) must check back every undecided half message and
reach the producer wherever its Telemetry stream is, so that each transaction ends once:
the ones the checker commits delivered exactly once, the ones it rolls back never.

The official Python client keeps one Telemetry stream per broker group, on the first
address of the route's sorted list that answers (gRPC pick_first), and rebuilds a broken
stream only on its five-minute settings sync. So these tests place the master elsewhere
than the replica holding the stream: the master's duties then reach the producer only
through another replica (capstan_transaction_checks_total{via="replica"}).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from rocketmq import (
    ClientConfiguration,
    Credentials,
    Producer,
    TransactionChecker,
    TransactionResolution,
)

from capstan.v1 import admin_pb2 as admin
from capstan.v1 import controller_pb2 as cpb
from tests.broker.broker_process import BrokerProcess
from tests.broker.replication.test_controlled_group import (
    GROUP,
    Cluster,
    start_cluster,
    stop_cluster,
)
from tests.broker.replication.test_replication_stream import bodies, scrape
from tests.broker.replication.test_slave_acting_master import configure_acting_group
from tests.broker.test_official_client import message
from tests.waiting import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

TOPIC = "Pay"
# Checks every half second from one second on; enough of them that nothing in doubt runs
# out of checks while the group fails over (orphans: test_transactions_and_restart.py).
CHECKS = {"transaction": {"check_timeout_ms": 1000, "check_interval_ms": 500, "max_checks": 200}}


class GatedChecker(TransactionChecker):
    """Says "not known yet" until opened; then commits bodies starting with b"commit" and
    rolls back the rest, counting what it was asked about."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.asked: Counter[str] = Counter()
        self._lock = threading.Lock()

    def check(self, message):
        if not self.opened.is_set():
            return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED
        with self._lock:
            self.asked[message.message_id] += 1
        if message.body.startswith(b"commit"):
            return TransactionResolution.COMMIT
        return TransactionResolution.ROLLBACK

    def asked_about(self, ids: set[str]) -> bool:
        with self._lock:
            return ids <= set(self.asked)

    def wait_for_checks(
        self, ids: set[str], brokers: list[BrokerProcess], timeout_s: float
    ) -> None:
        """Until every one of `ids` was asked about; on a timeout, what was not and what
        each broker counted, to tell a check never sent from one that went astray."""
        try:
            wait_until(lambda: self.asked_about(ids), timeout_s, "a check of every one")
        except AssertionError:
            with self._lock:
                missing = sorted(ids - set(self.asked))
            counted = {b.address: check_counts(b) for b in brokers}
            raise AssertionError(
                f"never asked about {missing}; brokers counted {counted}"
            ) from None


def send_in_doubt(producer: Producer, label: str, count: int) -> dict[str, bytes]:
    """`count` transactional messages, half to be committed, none decided: id -> body."""
    sent = {}
    for i in range(count):
        body = f"{'commit' if i % 2 == 0 else 'rollback'}-{label}-{i}".encode()
        receipt = producer.send(message(TOPIC, body), producer.begin_transaction())
        sent[receipt.message_id] = body
    return sent


def stream_holder(brokers: list[BrokerProcess]) -> BrokerProcess:
    """The replica the official client's Telemetry stream reaches: the smallest address."""
    return min(brokers, key=lambda b: b.address)


def knows_topic(b: BrokerProcess) -> bool:
    try:
        b.admin(here=True).DescribeTopic(admin.TopicRequest(name=TOPIC), timeout=5)
        return True
    except Exception:  # noqa: BLE001 - grpc.RpcError until the catalog arrives
        return False


def check_counts(b: BrokerProcess) -> list[str]:
    """The broker's transaction check figures, or why they could not be read."""
    try:
        return [x for x in scrape(b).splitlines() if x.startswith("capstan_transaction_check")]
    except OSError as exc:
        return [f"unreachable: {exc}"]


def relayed_checks(b: BrokerProcess) -> float:
    name = 'capstan_transaction_checks_total{via="replica"} '
    (line,) = [x for x in scrape(b).splitlines() if x.startswith(name)]
    return float(line.split()[-1])


def master_other_than(cluster: Cluster, gone: BrokerProcess) -> bool:
    try:
        return cluster.master() is not gone
    except (StopIteration, Exception):  # noqa: BLE001 - no master named, or none reachable
        return False


def move_master_off(cluster: Cluster, holder: BrokerProcess, dead: BrokerProcess | None) -> None:
    """Hand the leadership to the replica that is neither `holder` nor `dead`, if `holder`
    leads."""
    if cluster.master() is not holder:
        return
    info = cluster.info()
    avoid = {holder.address, dead.address if dead is not None else ""}
    other = next(r.broker_id for r in info.replicas if r.address not in avoid)

    def switched() -> bool:
        # Refused until `other` is in the SyncStateSet of the current epoch: ask again.
        cluster.controller.stub().ElectMaster(
            cpb.ElectMasterRequest(group=GROUP, preferred_broker_id=other), timeout=10
        )
        return master_other_than(cluster, holder)

    wait_until(switched, 30, "the switchover")
    if dead is None:  # the others rejoin the new master's SyncStateSet: it may fail over
        wait_until(lambda: cluster.settled(len(cluster.brokers)), 20, "every replica in sync")


def test_every_transaction_in_doubt_ends_once_through_two_master_kills(tmp_path: Path):
    cluster = start_cluster(tmp_path, replicas=3, broker=CHECKS)
    try:
        cluster.ready()
        cluster.master().create_topic(TOPIC, kind="TRANSACTION")
        wait_until(lambda: all(knows_topic(b) for b in cluster.brokers), 10, "the topic")
        holder = stream_holder(cluster.brokers)
        checker = GatedChecker()
        config = ClientConfiguration(cluster.controller.address, Credentials(), request_timeout=5)
        producer = Producer(config, (TOPIC,), checker)
        producer.startup()
        decided: dict[str, bytes] = {}
        try:
            for round_ in range(2):
                checker.opened.clear()
                move_master_off(cluster, holder, None)
                doubt = send_in_doubt(producer, f"r{round_}", 10)
                killed = cluster.master()
                killed.kill9()
                wait_until(lambda: master_other_than(cluster, killed), 20, "a new master")  # noqa: B023
                # Should the election pick the replica holding the stream, a switchover
                # moves the master on, so that only another replica can reach the producer.
                move_master_off(cluster, holder, killed)
                new_master = cluster.master()
                checker.opened.set()
                checker.wait_for_checks(set(doubt), cluster.brokers, 60)
                decided |= doubt
                committed = sorted(b for b in decided.values() if b.startswith(b"commit"))
                wait_until(
                    lambda: bodies(new_master, TOPIC) == committed,  # noqa: B023
                    20,
                    "the committed ones, each once",
                )
                assert relayed_checks(new_master) > 0
                killed.start()
                wait_until(lambda: cluster.settled(3), 30, "the killed broker back in sync")
                # It comes back as a slave: a returning broker takes no leadership back. (The
                # master may have moved between the two others meanwhile: in CI the new one
                # went 2.5 s without a heartbeat on a loaded machine and was deposed, which
                # ends no transaction twice.)
                assert cluster.master() is not killed
        finally:
            producer.shutdown()
        # Nothing is decided twice later, on any replica: each commit is there once.
        committed = sorted(b for b in decided.values() if b.startswith(b"commit"))
        assert len(committed) == 10
        for b in cluster.brokers:
            wait_until(lambda: bodies(b, TOPIC, here=True) == committed, 10, "every copy")  # noqa: B023
    finally:
        stop_cluster(cluster)


def acting_group_in_address_order(root: Path) -> tuple[list[BrokerProcess], BrokerProcess]:
    """A master and two slaves without a controller, plus a standalone broker of another
    group to escape to. The master has the largest address, the slave that acts for it
    (the smallest id) the middle one, so the client's stream lands on the other slave."""
    for name in ("a", "b", "c", "escape"):
        (root / name).mkdir()
    other = BrokerProcess(root / "escape", broker_name="group-b", **CHECKS)
    three = [BrokerProcess(root / n, broker_name=GROUP, **CHECKS) for n in ("a", "b", "c")]
    low, middle, high = sorted(three, key=lambda b: b.address)
    configure_acting_group([high, middle, low], other)
    return [high, middle, low], other


def test_a_slave_acting_for_a_dead_master_ends_every_transaction_in_doubt_once(tmp_path: Path):
    (master, acting, holder), other = acting_group_in_address_order(tmp_path)
    everyone = (other, master, acting, holder)
    try:
        for b in everyone:
            b.start()
        for b in (other, master):
            b.create_topic(TOPIC, kind="TRANSACTION")
            b.create_group("G")  # what bodies() reads with
        wait_until(lambda: knows_topic(acting) and knows_topic(holder), 10, "the topic")
        checker = GatedChecker()
        config = ClientConfiguration(holder.address, Credentials(), request_timeout=5)
        producer = Producer(config, (TOPIC,), checker)
        producer.startup()
        try:
            doubt = send_in_doubt(producer, "acting", 10)
            master.kill9()
            checker.opened.set()
            checker.wait_for_checks(set(doubt), [master, acting, holder], 60)
            committed = sorted(b for b in doubt.values() if b.startswith(b"commit"))
            # An acting master stores nothing itself: commits go to the other group.
            wait_until(lambda: bodies(other, TOPIC) == committed, 20, "the commits, each once")
            assert relayed_checks(acting) > 0
            # The master comes back and takes the decisions back: over a dozen check
            # intervals nothing is committed again, in either group.
            master.start()
            time.sleep(6)
            assert bodies(master, TOPIC, here=True) == []
            assert bodies(other, TOPIC) == committed
        finally:
            producer.shutdown()
    finally:
        for b in reversed(everyone):
            b.stop()
