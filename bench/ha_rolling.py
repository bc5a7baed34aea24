"""The rolling-restart figure of `capstan bench ha`: a controller and a group of 3 brokers
with the default settings, and an official RocketMQ 5 producer (rocketmq-python-client)
sending one message at a time through the controller's address while each broker in turn
gets SIGTERM and is started again, the slaves first, then the master (what the operator's
roller and a Kubernetes rolling update do).

Run twice in the same bench: with the graceful handover (the default) and, as the peer,
with `handover_timeout_ms: 0`, where a stopping broker just goes and the group waits for the
controller to notice. Figures per run: sends, failed sends, and the longest outage (from
the last acknowledged send before a failure to the first acknowledged one after it).
"""

from __future__ import annotations

import contextlib
import itertools
import pathlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
from rocketmq import ClientConfiguration, Credentials, Message, Producer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.bench.broker_bench import _free_port, _message, _tail
from capstan.bench.ha_bench import GROUP, Process, broker_config, controller_process
from capstan.client.admin import BlockingAdminClient, BlockingControllerClient
from capstan.client.errors import ClientError
from capstan.v1 import admin_pb2
from capstan.v1 import controller_pb2 as cpb

REPLICAS = 3
TOPIC = "RollingTopic"
SETTLE_LIMIT_S = 60.0


@dataclass
class Sends:
    """(monotonic time, acknowledged) of every send, in order."""

    outcomes: list[tuple[float, bool]] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(1 for _, ok in self.outcomes if not ok)

    def longest_outage_s(self) -> float:
        """From the last acknowledged send before a failure to the first acknowledged one
        after it; a stretch of failures that runs to the end counts up to the last send."""
        longest, last_ok, failing = 0.0, None, False
        for at, ok in self.outcomes:
            if not ok:
                failing = True
                continue
            if failing and last_ok is not None:
                longest = max(longest, at - last_ok)
            failing, last_ok = False, at
        if failing and self.outcomes:
            start = last_ok if last_ok is not None else self.outcomes[0][0]
            longest = max(longest, self.outcomes[-1][0] - start)
        return longest


def _send_until(producer: Producer, stop: threading.Event, sends: Sends) -> None:
    n = 0
    while not stop.is_set():
        message = Message()
        message.topic = TOPIC
        message.body = f"rolling-{n}".encode()
        n += 1
        try:
            producer.send(message)
            ok = True
        except Exception:  # noqa: BLE001 - the client raises its own error types
            ok = False
        sends.outcomes.append((time.monotonic(), ok))
        time.sleep(0.005)


def _send_to_master(
    stub: svc_grpc.MessagingServiceStub, stop: threading.Event, sends: Sends
) -> None:
    """One message per call straight to the master: what its acknowledgement costs, apart
    from which replica a client's channel sits on (an official client's channel may sit
    on the stopped slave itself, which passes sends on: see docs/benchmarks.md)."""
    n = 0
    while not stop.is_set():
        n += 1
        request = svc.SendMessageRequest(messages=[_message(TOPIC, f"ST{n:030X}")])
        try:
            ok = stub.SendMessage(request, timeout=10).status.code == pb.OK
        except grpc.RpcError:
            ok = False
        sends.outcomes.append((time.monotonic(), ok))
        time.sleep(0.005)


def _group(controller: BlockingControllerClient, group: str) -> cpb.ReplicaInfo | None:
    try:
        info: cpb.ReplicaInfo = controller.replica_info(group)
    except ClientError:
        return None
    return info


def _until_settled(
    controller: BlockingControllerClient, group: str, pid: int | None = None
) -> cpb.ReplicaInfo:
    """Until the group has a master and every replica in its SyncStateSet; with `pid`,
    also until the replica run by that process beats the controller (a restarted broker is
    back: without stepping aside the set never lost it, so its size alone says nothing)."""
    deadline = time.monotonic() + SETTLE_LIMIT_S
    while time.monotonic() < deadline:
        info = _group(controller, group)
        back = pid is None or (
            info is not None and any(r.pid == pid and r.alive for r in info.replicas)
        )
        if info is not None and info.master_id and len(info.sync_state_set) == REPLICAS and back:
            return info
        time.sleep(0.05)
    raise RuntimeError(f"the group did not get a master with {REPLICAS} in sync in time")


@contextlib.contextmanager
def _group_running(
    root: pathlib.Path, extra: dict[str, object]
) -> Iterator[tuple[str, list[Process], list[int]]]:
    """A controller and REPLICAS brokers with `extra` replication settings, running:
    (the controller's address, the brokers, their ports). On a failure their logs' tails
    are printed; every process is stopped at the end."""
    controller_port = _free_port()
    controller_address = f"127.0.0.1:{controller_port}"
    controller = controller_process(root, controller_port)
    ports = [_free_port() for _ in range(REPLICAS)]
    brokers = [
        Process(f"broker {i + 1}", root / f"b{i + 1}", {}, "broker") for i in range(REPLICAS)
    ]
    for broker, port in zip(brokers, ports, strict=True):
        broker.config = broker_config(broker.root, port, controller_address, REPLICAS, extra)
    controller.start()
    for broker in brokers:
        broker.start()
    try:
        yield controller_address, brokers, ports
    except Exception:
        for p in (controller, *brokers):
            print(f"--- {p.name} log:\n{_tail(p.root / 'out.log')}", flush=True)
        raise
    finally:
        for p in (*brokers, controller):
            p.resume()
            p.stop()


def _create_topic(master: str) -> None:
    with BlockingAdminClient(master) as admin:
        admin.create_topic(admin_pb2.Topic(name=TOPIC, read_queue_nums=4, write_queue_nums=4))


def rolling_restart_figures(root: pathlib.Path, handover: bool) -> dict[str, float]:
    extra: dict[str, object] = {} if handover else {"handover_timeout_ms": 0}
    sends, stop = Sends(), threading.Event()
    stops: list[tuple[bool, float]] = []
    """(was the master, seconds from SIGTERM to its exit) per broker restarted."""
    with _group_running(root, extra) as (controller_address, brokers, ports):
        controller_client = BlockingControllerClient(controller_address, timeout_s=2, retry_s=0)
        info = _until_settled(controller_client, GROUP)
        _create_topic(info.master_address)
        first_epoch = info.master_epoch
        master = brokers[ports.index(int(info.master_address.rsplit(":", 1)[1]))]
        order = [b for b in brokers if b is not master] + [master]
        config = ClientConfiguration(controller_address, Credentials(), request_timeout=3)
        producer = Producer(config, (TOPIC,))
        producer.startup()
        sender = threading.Thread(target=_send_until, args=(producer, stop, sends))
        sender.start()
        try:
            time.sleep(1.0)  # sends before the first restart
            for broker in order:
                print(f"    restarting {broker.name} ...", flush=True)
                stopping = time.monotonic()
                broker.stop()
                stops.append((broker is master, time.monotonic() - stopping))
                broker.start()
                assert broker.proc is not None
                _until_settled(controller_client, GROUP, broker.proc.pid)
            time.sleep(1.0)
        finally:
            stop.set()
            sender.join(30)
            producer.shutdown()
        after = _group(controller_client, GROUP)
        controller_client.close()
    return {
        "sends": float(len(sends.outcomes)),
        "failed_sends": float(sends.failed),
        "longest_outage_s": sends.longest_outage_s(),
        "elections": float(after.master_epoch - first_epoch) if after is not None else -1.0,
        "slowest_slave_stop_s": max(s for was_master, s in stops if not was_master),
        "master_stop_s": max(s for was_master, s in stops if was_master),
    }


STALL_S = 4.0
"""How long the stalled-slave figure keeps one slave stopped (SIGSTOP)."""


def longest_gap_s(outcomes: list[tuple[float, bool]], start: float, end: float) -> float:
    """The longest time between two acknowledged sends, within [start, end]."""
    acked = [at for at, ok in outcomes if ok and start <= at <= end]
    points = [start, *acked, end]
    return max(b - a for a, b in itertools.pairwise(points))


def stalled_slave_figure(root: pathlib.Path, quorum: bool) -> float:
    """The longest gap between acknowledged sends, one at a time to the master, while one
    slave of three is stopped for STALL_S: by quorum (in_sync_replicas 2), or, as the peer,
    waiting for every SyncStateSet member (the slave leaves the set after 15 s, so the
    writes wait out the stall)."""
    extra: dict[str, object] = (
        {"all_ack_in_sync_state_set": False, "in_sync_replicas": 2}
        if quorum
        else {"all_ack_in_sync_state_set": True}
    )
    sends, stop = Sends(), threading.Event()
    with _group_running(root, extra) as (controller_address, brokers, ports):
        controller_client = BlockingControllerClient(controller_address, timeout_s=2, retry_s=0)
        info = _until_settled(controller_client, GROUP)
        controller_client.close()
        _create_topic(info.master_address)
        master = brokers[ports.index(int(info.master_address.rsplit(":", 1)[1]))]
        stalled = next(b for b in brokers if b is not master)
        channel = grpc.insecure_channel(info.master_address)
        sender = threading.Thread(
            target=_send_to_master, args=(svc_grpc.MessagingServiceStub(channel), stop, sends)
        )
        sender.start()
        try:
            time.sleep(1.0)
            began = time.monotonic()
            stalled.pause()
            time.sleep(STALL_S)
            stalled.resume()
            time.sleep(1.0)
            ended = time.monotonic()
        finally:
            stop.set()
            sender.join(30)
            channel.close()
    return longest_gap_s(sends.outcomes, began, ended)


def stalled_slave_pair(root: pathlib.Path) -> dict[str, float]:
    figures: dict[str, float] = {}
    for quorum in (True, False):
        label = "quorum" if quorum else "all_ack"
        print(
            f"  running: one slave of {REPLICAS} stopped for {STALL_S:.0f} s ({label}) ...",
            flush=True,
        )
        figures[f"stalled_slave_{label}_longest_gap_s"] = stalled_slave_figure(
            root / f"stalled-{label}", quorum
        )
    return figures


def rolling_restart_pair(root: pathlib.Path) -> dict[str, float]:
    """The figures with the handover and, as the peer, without it."""
    figures: dict[str, float] = {}
    for handover in (True, False):
        label = "handover" if handover else "no_handover"
        print(f"  running: rolling restart of {REPLICAS} replicas ({label}) ...", flush=True)
        run = rolling_restart_figures(root / label, handover)
        figures.update({f"rolling_{label}_{name}": value for name, value in run.items()})
    return figures
