"""A broker group run by the controller, as real processes: the brokers register, one is
made master and the other follows and joins the SyncStateSet; when the master is killed the
slave is elected and serves every acknowledged message; the old master comes back as a
slave; a slave that stops keeping up is dropped from the SyncStateSet."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.v1 import admin_pb2 as admin
from capstan.v1 import controller_pb2 as cpb
from tests.broker.broker_process import BrokerProcess
from tests.broker.replication.test_replication_stream import bodies, has_group, scrape
from tests.broker.v2_requests import METADATA, ack, now_ms, receive, send, stub, v2_message
from tests.controller.controller_process import ControllerProcess
from tests.tiers import process_tool
from tests.waiting import wait_until

GROUP = "group-a"


@dataclass
class Cluster:
    controller: ControllerProcess
    brokers: list[BrokerProcess]

    def info(self) -> cpb.ReplicaInfo:
        return self.controller.group(GROUP)

    def by_id(self, broker_id: int) -> BrokerProcess:
        info = self.info()
        address = next(r.address for r in info.replicas if r.broker_id == broker_id)
        return next(b for b in self.brokers if b.address == address)

    def master(self) -> BrokerProcess:
        return self.by_id(self.info().master_id)

    def slave(self) -> BrokerProcess:
        master = self.master()
        return next(b for b in self.brokers if b is not master)

    def ready(self, topic: str = "T", queues: int = 4) -> tuple[BrokerProcess, BrokerProcess]:
        """(master, a slave) once every replica is in the SyncStateSet and the slave holds
        `topic` and group G, created on the master."""
        everyone = len(self.brokers)
        wait_until(lambda: self.settled(everyone), 20, "a master with its slaves in sync")
        master, slave = self.master(), self.slave()
        master.create_topic(topic, queues=queues)
        master.create_group("G")
        wait_until(lambda: has_group(slave, "G"), 10, "the topic and group on the slave")
        return master, slave

    def settled(self, members: int) -> bool:
        """A master is elected and the SyncStateSet has `members` brokers."""
        try:
            info = self.info()
        except grpc.RpcError:
            return False  # no broker registered yet
        return info.master_id > 0 and len(info.sync_state_set) == members


def start_cluster(
    root: Path,
    replicas: int = 2,
    controller: dict[str, Any] | None = None,
    broker: dict[str, Any] | None = None,
    each: list[dict[str, Any]] | None = None,
    **replication: Any,
) -> Cluster:
    """A controller (its settings overridden by `controller`) and `replicas` brokers of
    GROUP with `replication` settings (and the other settings in `broker`, then broker
    i's own in `each[i]`)."""
    controller_process = ControllerProcess(
        root / "controller", root / "controller-state", **(controller or {})
    ).start()
    brokers = []
    for i in range(replicas):
        (root / f"b{i}").mkdir()
        brokers.append(
            BrokerProcess(
                root / f"b{i}",
                **(broker or {}),
                **(each[i] if each else {}),
                broker_name=GROUP,
                replication={
                    "controller_address": f"127.0.0.1:{controller_process.port}",
                    "replicas": replicas,
                    "heartbeat_interval_ms": 300,
                    "slave_ack_timeout_ms": 2000,
                }
                | replication,
            )
        )
    cluster = Cluster(controller_process, brokers)
    try:
        for b in brokers:
            b.start()
    except BaseException:
        with contextlib.suppress(Exception):  # the start's own failure is the one to see
            stop_cluster(cluster)
        raise
    return cluster


def stop_cluster(c: Cluster) -> None:
    """Stop every broker and the controller, each even when stopping another failed (one
    not stopping on SIGTERM is killed and named); then raise the first failure."""
    failures: list[BaseException] = []
    for b in c.brokers:
        try:
            if b.proc is not None and b.proc.poll() is None:
                os.kill(b.proc.pid, signal.SIGCONT)  # a stopped process cannot take SIGTERM
            b.stop()
        except Exception as exc:  # noqa: BLE001 - the others are stopped first
            failures.append(exc)
    try:
        c.controller.stop()
    except Exception as exc:  # noqa: BLE001
        failures.append(exc)
    if failures:
        raise failures[0]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = start_cluster(tmp_path)
    try:
        yield c
    finally:
        stop_cluster(c)


def send_code(b: BrokerProcess, body: bytes, topic: str = "T", timeout_s: float = 10) -> int:
    """The send's status code; -1 when the call itself failed (say, passed on to a master
    that is gone) or took over `timeout_s`."""
    try:
        return send(stub(b.address), v2_message(topic, body), timeout_s=timeout_s).status.code
    except grpc.RpcError:
        return -1


def route_addresses(b: BrokerProcess, topic: str = "T") -> set[str]:
    """The host:port addresses `b`'s QueryRoute names for `topic`."""
    reply = stub(b.address).QueryRoute(
        svc.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=METADATA, timeout=10
    )
    return {
        f"{a.host}:{a.port}" for q in reply.message_queues for a in q.broker.endpoints.addresses
    }


def metric(text: str, name: str) -> float:
    """The value of the one sample of `name` in a /metrics page."""
    (line,) = [x for x in text.splitlines() if x.startswith((name + "{", name + " "))]
    return float(line.split()[-1])


def test_a_controlled_pair_elects_a_master_and_its_slave_joins_the_sync_state_set(cluster):
    master, slave = cluster.ready()
    sent = []
    for i in range(100):
        body = f"m-{i}".encode()
        assert send_code(master, body) == pb.OK
        sent.append(body)
    # Acknowledged means the slave has it, and reads it once it hears the confirm offset.
    assert slave.queue_ends("T", here=True) == master.queue_ends("T")
    wait_until(lambda: bodies(slave, "T", here=True) == sorted(sent), 5, "the slave's copy")
    # A send to the slave is passed on to the master.
    assert send_code(slave, b"via the slave") == pb.OK
    assert b"via the slave" in bodies(master, "T")
    info = cluster.info()
    assert info.master_epoch == 1
    assert all(r.alive for r in info.replicas)


def test_the_slave_takes_over_a_killed_master_with_every_acknowledged_message(cluster):
    master, slave = cluster.ready()
    before = cluster.info()
    acked = []
    for i in range(200):
        body = f"before-{i}".encode()
        if send_code(master, body) == pb.OK:
            acked.append(body)
    assert len(acked) == 200
    master.kill9()
    wait_until(lambda: send_code(slave, b"after") == pb.OK, 20, "the slave to take writes")
    after = cluster.info()
    assert after.master_epoch > before.master_epoch
    assert cluster.master() is slave
    held = bodies(slave, "T", here=True)
    assert set(acked) <= set(held)
    # The old master returns as a slave of the new one and rejoins the SyncStateSet.
    master.start()
    wait_until(lambda: cluster.settled(2), 20, "the old master to rejoin")
    assert cluster.master() is slave
    assert send_code(slave, b"together") == pb.OK
    wait_until(lambda: bodies(master, "T", here=True) == bodies(slave, "T"), 5, "the same messages")
    assert send_code(master, b"via the old master") == pb.OK  # passed on to the new one
    assert b"via the old master" in bodies(slave, "T", here=True)


def test_a_stopped_slave_leaves_the_sync_state_set_and_writes_go_on(tmp_path: Path):
    # The write times out (1 s) well before the master gives up on the slave (4 s), so the
    # unconfirmed message is looked for while the slave still counts (the stall rule, which
    # would take it out after 1 s, as the write times out, is off here).
    cluster = start_cluster(
        tmp_path,
        ha_max_time_slave_not_catchup_ms=4000,
        slave_ack_timeout_ms=1000,
        slave_stall_ms=0,
    )
    try:
        master, slave = cluster.ready()
        wait_until(lambda: send_code(master, b"first") == pb.OK, 10, "a first send")
        assert slave.proc is not None
        os.kill(slave.proc.pid, signal.SIGSTOP)
        # Stored on the master, but the slave never acknowledges it: not confirmed, so no
        # consumer may read it while the slave still counts as in sync.
        assert send_code(master, b"unconfirmed") == pb.SLAVE_PERSISTENCE_TIMEOUT
        assert 'capstan_put_failures_total{status="FLUSH_SLAVE_TIMEOUT"} 1.0' in scrape(master)
        assert b"unconfirmed" not in bodies(master, "T")
        wait_until(lambda: cluster.settled(1), 20, "the SyncStateSet to shrink to the master")
        assert b"unconfirmed" in bodies(master, "T")  # the master alone now holds the set
        assert send_code(master, b"alone") == pb.OK  # min_in_sync_replicas is 1 for two
        # Once the controller counts it dead, routes leave it out: the official client's
        # channel keeps to a route's lowest address, and calls to a stopped process hang.
        wait_until(
            lambda: route_addresses(master) == {master.address}, 20, "a route without the slave"
        )
        os.kill(slave.proc.pid, signal.SIGCONT)
        wait_until(lambda: cluster.settled(2), 20, "the slave to rejoin")
        wait_until(
            lambda: route_addresses(master) == {master.address, slave.address},
            10,
            "the slave back in routes",
        )
        assert send_code(master, b"together") == pb.OK
        wait_until(
            lambda: bodies(slave, "T", here=True) == bodies(master, "T"), 5, "the same messages"
        )
    finally:
        stop_cluster(cluster)


def test_by_quorum_a_stopped_slave_of_three_holds_back_no_write_nor_read(tmp_path: Path):
    """Three replicas acknowledging by quorum (all_ack_in_sync_state_set off,
    in_sync_replicas 2): one slave stopped (SIGSTOP) is still in the SyncStateSet (the stall
    rule is off here, so it leaves only after 30 s), yet every write is acknowledged by the
    master and the other slave, and consumers read it at once. Let go, the slave catches
    up. (A copy may take a while on CI's loaded machine: 6 s for an ack here, still far
    below the 30 s a write would wait for the stopped slave were every member needed.)"""
    cluster = start_cluster(
        tmp_path,
        replicas=3,
        all_ack_in_sync_state_set=False,
        in_sync_replicas=2,
        ha_max_time_slave_not_catchup_ms=30_000,
        slave_ack_timeout_ms=6_000,
        # With the stall rule on, the stopped slave leaves once 1 s passes with copies
        # unacknowledged, which 20 sends on a loaded machine can outlast.
        slave_stall_ms=0,
    )
    try:
        master, slave = cluster.ready()
        assert send_code(master, b"first") == pb.OK
        assert slave.proc is not None
        os.kill(slave.proc.pid, signal.SIGSTOP)
        try:
            for i in range(20):
                assert send_code(master, b"while-stopped-%d" % i) == pb.OK
            assert cluster.settled(3)  # the stopped slave still counts as a member
            read = bodies(master, "T")
            assert all(b"while-stopped-%d" % i in read for i in range(20))
        finally:
            os.kill(slave.proc.pid, signal.SIGCONT)
        wait_until(
            lambda: bodies(slave, "T", here=True) == bodies(master, "T"), 15, "the slave caught up"
        )
    finally:
        stop_cluster(cluster)


def test_with_min_in_sync_replicas_2_a_master_alone_refuses_writes_until_the_slave_is_back(
    tmp_path: Path,
):
    cluster = start_cluster(tmp_path, ha_max_time_slave_not_catchup_ms=2000, min_in_sync_replicas=2)
    try:
        master, slave = cluster.ready()
        wait_until(lambda: send_code(master, b"first") == pb.OK, 10, "a first send")
        assert slave.proc is not None
        os.kill(slave.proc.pid, signal.SIGSTOP)
        wait_until(lambda: cluster.settled(1), 20, "the SyncStateSet to shrink to the master")
        reply = send(stub(master.address), v2_message("T", b"refused"))
        assert reply.status.code == pb.HA_NOT_AVAILABLE  # IN_SYNC_REPLICAS_NOT_ENOUGH
        assert "in sync" in reply.status.message
        # What an alert compares: the SyncStateSet below the minimum, and the refusals.
        figures = scrape(master)
        assert 'status="IN_SYNC_REPLICAS_NOT_ENOUGH"} 1.0' in figures
        assert metric(figures, "capstan_replica_sync_state_set_size") == 1
        assert metric(figures, "capstan_replica_min_in_sync_replicas") == 2
        assert b"refused" not in bodies(master, "T", here=True)  # nothing was stored
        os.kill(slave.proc.pid, signal.SIGCONT)
        # The slave holds everything the master has: it rejoins without any new write.
        wait_until(lambda: cluster.settled(2), 20, "the slave to rejoin")
        assert send_code(master, b"together") == pb.OK
        # The slave holds it once acknowledged, and serves it once the master's next beat or
        # chunk tells it the write is confirmed.
        wait_until(
            lambda: bodies(slave, "T", here=True) == sorted([b"first", b"together"]),
            5,
            "the slave to serve both messages",
        )
    finally:
        stop_cluster(cluster)


def test_a_promoted_slave_honours_the_masters_handles_pop_progress_and_delays(cluster):
    wait_until(lambda: cluster.settled(2), 20, "a master with its slave in the SyncStateSet")
    master, slave = cluster.master(), cluster.slave()
    master.create_topic("T", queues=1)
    master.create_topic("D", kind="DELAY", queues=1)
    master.create_group("G")
    wait_until(lambda: has_group(slave, "G"), 10, "the topic and group on the slave")
    s = stub(master.address)
    for i in range(4):
        assert send(s, v2_message("T", f"m-{i}".encode())).status.code == pb.OK
    _, got = receive(s, "G", "T", batch=4, invisible_ms=60_000)
    assert [m.body for m in got] == [b"m-0", b"m-1", b"m-2", b"m-3"]
    handles = [m.system_properties.receipt_handle for m in got]
    for m in got[:2]:
        assert ack(s, "G", "T", m.system_properties.receipt_handle).status.code == pb.OK
    due_ms = now_ms() + 5_000
    delayed = v2_message("D", b"later", message_type=pb.DELAY, delivery_timestamp_ms=due_ms)
    assert send(s, delayed).status.code == pb.OK
    # Pop state and progress travel with the metadata, twice a second: the slave has them once
    # it counts the two unacknowledged messages in flight.
    wait_until(lambda: in_flight(slave, "G", "T") == 2, 10, "the pop state on the slave")
    master.kill9()
    wait_until(lambda: send_code(slave, b"after") == pb.OK, 20, "the slave to take writes")
    ns = stub(slave.address)
    # A handle the old master issued is good here, for a message still in flight.
    assert ack(ns, "G", "T", handles[2]).status.code == pb.OK
    assert ack(ns, "G", "T", handles[0]).status.code != pb.OK  # acknowledged before: stale
    # Nothing acknowledged or in flight comes again; only what was sent since.
    _, again = receive(ns, "G", "T", batch=32, wait_ms=500)
    assert [m.body for m in again] == [b"after"]
    # The delayed message is delivered by the new master's timer, not before it is due.
    _, early = receive(ns, "G", "D", wait_ms=200)
    assert early == [] or now_ms() >= due_ms
    found: list[bytes] = []
    wait_until(
        lambda: found.extend(m.body for m in receive(ns, "G", "D", wait_ms=500)[1]) or found,
        15,
        "the delayed message on the new master",
    )
    assert found == [b"later"] and now_ms() >= due_ms


def in_flight(broker: BrokerProcess, group: str, topic: str) -> int:
    """Messages of `topic` in flight for `group`, as `broker` itself knows them."""
    reply = broker.admin(here=True).DescribeGroup(admin.GroupRequest(name=group), timeout=5)
    return sum(o.inflight for o in reply.group.offsets if o.topic == topic)


@process_tool
def cluster_cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    server = f"127.0.0.1:{cluster.controller.port}"
    return subprocess.run(
        [sys.executable, "-m", "capstan.cli", "cluster", *args, "--server", server],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )


def test_cluster_status_shows_the_group_and_elect_master_switches_it_over(cluster):
    master, slave = cluster.ready()
    info = cluster.info()
    done = cluster_cli(cluster, "status", "--json")
    assert done.returncode == 0, done.stderr
    (group,) = json.loads(done.stdout)["groups"]
    assert group["name"] == GROUP and group["epoch"] == info.master_epoch
    assert group["master"] == info.master_id
    assert sorted(group["sync_state_set"]) == sorted(r.broker_id for r in info.replicas)
    pids = {b.proc.pid for b in cluster.brokers if b.proc is not None}
    assert {r["pid"] for r in group["replicas"]} == pids
    assert {r["address"] for r in group["replicas"]} == {master.address, slave.address}
    assert sorted(r["role"] for r in group["replicas"]) == ["master", "slave"]
    assert all(isinstance(r["ack_offset"], int) for r in group["replicas"])
    human = cluster_cli(cluster, "status")
    assert human.returncode == 0 and f"group {GROUP}: master {info.master_id}" in human.stdout
    # A controlled switchover to the slave: it leads at a new epoch, the old master follows.
    slave_id = next(r.broker_id for r in info.replicas if r.address == slave.address)
    switched = cluster_cli(cluster, "elect-master", GROUP, "--broker-id", str(slave_id))
    assert switched.returncode == 0, switched.stdout + switched.stderr
    wait_until(lambda: send_code(slave, b"on the new master", "T") == pb.OK, 10, "writes")
    assert cluster.info().master_epoch == info.master_epoch + 1
    wait_until(lambda: cluster.settled(2), 20, "the old master to rejoin the SyncStateSet")
    assert send_code(master, b"via the old master") == pb.OK
    again = cluster_cli(cluster, "elect-master", GROUP, "--broker-id", str(slave_id))
    assert again.returncode == 1 and "already the master" in again.stdout


def test_a_topic_or_group_change_is_answered_once_the_slave_holds_it(tmp_path: Path):
    # Metadata would otherwise reach the slave only every minute: the answer to an admin
    # change must wait for the slave's copy, so a master killed at once loses nothing.
    c = start_cluster(tmp_path, metadata_interval_ms=60_000)
    try:
        wait_until(lambda: c.settled(2), 20, "a master with its slave in sync")
        master, slave = c.master(), c.slave()
        master.create_topic("T", queues=2)
        master.create_group("G")
        assert has_group(slave, "G")  # already there, not a minute later
        master.admin().UpdateGroup(admin.Group(name="G", fifo=True), timeout=10)
        master.kill9()
        wait_until(lambda: send_code(slave, b"after") == pb.OK, 20, "the slave to take writes")
        described = slave.admin().DescribeGroup(admin.GroupRequest(name="G"), timeout=10)
        assert described.group.group.fifo is True
    finally:
        stop_cluster(c)
