"""`capstan bench ha`: a controller and a broker group of a master and a slave, as real
processes on 127.0.0.1, with the default (safe) acknowledgement: a write is acknowledged
once both hold it.

Figures: batched produce (1 KiB, 64 per SendMessage, several calls in flight) to the
replicated master, and, as the peer in the same run, to a standalone broker doing the same
work, in alternating turns (the cost of SYNC replication is their ratio); then the failover
time: a client sends one message per call through the slave's address while the master is
killed with SIGKILL, and the figure is the time from the kill to the first acknowledged
write on the new master, with the controller's default timeouts. Every write acknowledged
before the kill is then counted on the new master.

Prints a table, then one line of JSON with the figures (the last line of output).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.bench.broker_bench import (
    BATCH,
    BATCH_TOPIC,
    Stub,
    _free_port,
    _message,
    _prepare,
    _stop,
    _tail,
    _wait_serving,
    produce_batched,
)
from capstan.client.admin import AdminClient, ControllerClient
from capstan.client.errors import ClientError
from capstan.v1 import controller_pb2 as cpb

GROUP = "bench-ha"
QUICK_MESSAGES = 20_480
FULL_MESSAGES = 102_400
FAILOVER_LIMIT_S = 60.0
TURNS = 4
"""Batched produce: turns each to the replicated group and to the standalone peer."""


@dataclass
class Process:
    name: str
    root: pathlib.Path
    config: dict[str, object]
    kind: str  # broker or controller
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"{self.kind}.yaml"
        path.write_text(json.dumps(self.config))  # JSON is YAML
        log = open(self.root / "out.log", "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "capstan.cli", self.kind, "--config", str(path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONSAFEPATH="1"),
        )
        log.close()

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc, self.name)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP: a hung process, its connections open, answering nothing."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)


def broker_config(
    root: pathlib.Path,
    port: int,
    controller: str | None,
    replicas: int = 2,
    replication: dict[str, object] | None = None,
) -> dict[str, object]:
    config: dict[str, object] = {
        "broker_name": GROUP,
        "data_dir": str(root / "data"),
        "listen_host": "127.0.0.1",
        "grpc_port": port,
        "http_port": -1,  # the shutdown grace is the default: the stops below are a user's
    }
    if controller is not None:
        config["replication"] = {
            "controller_address": controller,
            "replicas": replicas,
            **(replication or {}),
        }
    return config


def controller_process(root: pathlib.Path, port: int) -> Process:
    """A controller on `port` keeping its state (a file store) under `root`."""
    return Process(
        "the controller",
        root / "controller",
        {
            "listen_host": "127.0.0.1",
            "grpc_port": port,
            "http_port": -1,
            "state": {"backend": "file", "directory": str(root / "controller" / "state")},
        },
        "controller",
    )


async def _group(controller: ControllerClient) -> cpb.ReplicaInfo | None:
    try:
        info: cpb.ReplicaInfo = await controller.replica_info(GROUP)
    except ClientError:
        return None
    return info


async def _until_in_sync(controller: ControllerClient, timeout_s: float = 60) -> cpb.ReplicaInfo:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = await _group(controller)
        if info is not None and info.master_id and len(info.sync_state_set) == 2:
            return info
        await asyncio.sleep(0.2)
    raise RuntimeError("the group did not get a master with its slave in sync in time")


@contextlib.asynccontextmanager
async def standalone_broker(root: pathlib.Path) -> AsyncIterator[Stub]:
    """The peer: a broker of its own, no controller, no slave; its v2 stub."""
    port = _free_port()
    broker = Process("the standalone broker", root / "standalone", {}, "broker")
    broker.config = broker_config(broker.root, port, None)
    broker.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await _wait_serving(channel)
            await _prepare(f"127.0.0.1:{port}", static_on=None)
            yield svc_grpc.MessagingServiceStub(channel)
    finally:
        broker.stop()


async def produce_turns(replicated: Stub, standalone: Stub, messages: int) -> dict[str, float]:
    """Batched produce to the replicated master and to the standalone peer in TURNS turns
    each, in the order replicated, standalone, standalone, replicated, ...: drift on a
    shared machine, and a fresh broker's first writes, fall on both alike."""
    per_turn = max(BATCH, messages // TURNS // BATCH * BATCH)
    sent = {"replicated": 0, "standalone": 0}
    took = {"replicated": 0.0, "standalone": 0.0}
    stubs = {"replicated": replicated, "standalone": standalone}
    for turn in range(2 * TURNS):
        name = ("replicated", "standalone")[(turn + turn // 2) % 2]
        n, seconds = await produce_batched(stubs[name], per_turn)
        sent[name] += n
        took[name] += seconds
    return {
        "sync_replicated_produce_msgs_per_s": sent["replicated"] / took["replicated"],
        "standalone_produce_msgs_per_s": sent["standalone"] / took["standalone"],
        "replicated_sent": float(sent["replicated"]),
    }


async def _total_messages(address: str) -> int:
    async with AdminClient(address) as admin:
        reply = await admin.describe_topic(BATCH_TOPIC)
        return sum(q.max_offset for q in reply.topic.queues)


async def failover_figure(
    slave: str, fault: Callable[[], None], send_timeout_s: float = 2.0
) -> tuple[float, int]:
    """Send one message per call through `slave`, then `fault()` (the master killed or
    stopped); seconds from the fault to the first acknowledged write after it, and the
    writes acknowledged before it. `send_timeout_s` bounds a send a stopped master holds."""
    async with grpc.aio.insecure_channel(slave) as channel:
        mq = svc_grpc.MessagingServiceStub(channel)
        acked = 0
        n = 0

        async def send() -> bool:
            nonlocal n
            n += 1
            request = svc.SendMessageRequest(messages=[_message(BATCH_TOPIC, f"FO{n:030X}")])
            try:
                reply = await mq.SendMessage(request, timeout=send_timeout_s)
            except grpc.aio.AioRpcError:
                return False
            return bool(reply.status.code == pb.OK)

        for _ in range(200):
            acked += await send()
        fault()
        killed = time.monotonic()
        while time.monotonic() - killed < FAILOVER_LIMIT_S:
            if await send():
                return time.monotonic() - killed, acked
            await asyncio.sleep(0.05)
    raise RuntimeError(f"no write was acknowledged within {FAILOVER_LIMIT_S:.0f} s of the kill")


async def replicated_figures(root: pathlib.Path, messages: int) -> dict[str, float | None]:
    controller_port = _free_port()
    controller = controller_process(root, controller_port)
    address = f"127.0.0.1:{controller_port}"
    ports = [_free_port(), _free_port()]
    brokers = [
        Process(f"broker {i + 1}", root / f"b{i + 1}", {}, "broker") for i in range(len(ports))
    ]
    for broker, port in zip(brokers, ports, strict=True):
        broker.config = broker_config(broker.root, port, address)
    controller.start()
    for broker in brokers:
        broker.start()
    try:
        async with ControllerClient(address, timeout_s=2, retry_s=0) as controller_client:
            info = await _until_in_sync(controller_client)
            master_address = info.master_address
            master = brokers[ports.index(int(master_address.rsplit(":", 1)[1]))]
            slave_address = next(r.address for r in info.replicas if r.broker_id != info.master_id)
            async with (
                grpc.aio.insecure_channel(master_address) as to_master,
                standalone_broker(root) as standalone,
            ):
                await _wait_serving(to_master)
                await _prepare(master_address, static_on=None)
                print(
                    f"  running: {messages:,} messages each, SYNC replication to 2 and the "
                    f"standalone peer, {TURNS} turns each ...",
                    flush=True,
                )
                produced = await produce_turns(
                    svc_grpc.MessagingServiceStub(to_master), standalone, messages
                )
            sent = int(produced.pop("replicated_sent"))
            await _until_in_sync(controller_client)
            print("  running: failover (kill -9 of the master) ...", flush=True)
            failover_s, acked = await failover_figure(slave_address, master.kill)
            held = await _total_messages(slave_address)
            lost = max(0, sent + acked - held)
            print("  running: failover (SIGSTOP of the new master) ...", flush=True)
            master.start()  # back as a slave of the new master
            info = await _until_in_sync(controller_client)
            stopped = brokers[ports.index(int(info.master_address.rsplit(":", 1)[1]))]
            other = next(r.address for r in info.replicas if r.broker_id != info.master_id)
            try:
                stop_s, stop_acked = await failover_figure(other, stopped.pause, 0.5)
            finally:
                stopped.resume()
            stop_lost = max(0, held + stop_acked - await _total_messages(other))
            after = await _group(controller_client)
        return {
            **produced,
            "failover_s": failover_s,
            "acked_before_kill": float(sent + acked),
            "acked_lost": float(lost),
            "sigstop_failover_s": stop_s,
            "sigstop_acked_lost": float(stop_lost),
            "master_epoch_after": float(after.master_epoch) if after is not None else None,
        }
    except Exception:
        for p in (controller, *brokers):
            print(f"--- {p.name} log:\n{_tail(p.root / 'out.log')}", file=sys.stderr)
        raise
    finally:
        for p in (*brokers, controller):
            p.stop()


def main(quick: bool = False, directory: str | None = None) -> None:
    # ha_rolling imports this module
    from capstan.bench.ha_rolling import rolling_restart_pair, stalled_slave_pair

    messages = QUICK_MESSAGES if quick else FULL_MESSAGES
    root = pathlib.Path(tempfile.mkdtemp(prefix="capstan-ha-bench-", dir=directory))
    try:
        print("capstan bench ha: 1 KiB messages, batched produce (64 per call)", flush=True)
        figures: dict[str, float | None] = {}
        figures.update(asyncio.run(replicated_figures(root, messages)))
        figures.update(stalled_slave_pair(root / "stalled"))
        figures.update(rolling_restart_pair(root / "rolling"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    replicated = figures["sync_replicated_produce_msgs_per_s"] or 0.0
    standalone = figures["standalone_produce_msgs_per_s"] or 0.0
    figures["ratio_replicated_to_standalone"] = replicated / standalone
    print()
    print(f"{'figure':<44}{'value':>14}  target")
    print(f"{'SYNC replicated batched produce, msg/s':<44}{replicated:>14,.0f}  >= 30,000")
    print(f"{'standalone batched produce (peer), msg/s':<44}{standalone:>14,.0f}")
    ratio = figures["ratio_replicated_to_standalone"]
    print(f"{'ratio replicated / standalone':<44}{ratio:>14.2f}")
    print(f"{'failover: kill -9 to first ack, s':<44}{figures['failover_s']:>14.2f}  <= 10")
    lost = figures["acked_lost"]
    print(f"{'acknowledged writes missing after failover':<44}{lost:>14.0f}  0")
    print(f"{'failover: SIGSTOP to first ack, s':<44}{figures['sigstop_failover_s']:>14.2f}  < 3")
    lost = figures["sigstop_acked_lost"]
    print(f"{'  acknowledged writes missing after it':<44}{lost:>14.0f}  0")
    for label, target in (("quorum", "  < 1"), ("all_ack", "")):
        gap = figures[f"stalled_slave_{label}_longest_gap_s"]
        name = "by quorum" if label == "quorum" else "all-ack (peer)"
        print(f"{'one slave of 3 stopped, ' + name + ': gap, s':<44}{gap:>14.2f}{target}")
    for label, name in (("handover", "with handover"), ("no_handover", "no handover (peer)")):
        outage = figures[f"rolling_{label}_longest_outage_s"]
        failed = figures[f"rolling_{label}_failed_sends"]
        sends = figures[f"rolling_{label}_sends"]
        target = "  < 1" if label == "handover" else ""
        print(f"{'rolling restart, ' + name + ': outage, s':<44}{outage:>14.2f}{target}")
        print(f"{'  failed sends of all sends':<44}{f'{failed:.0f} / {sends:.0f}':>14}")
        for role, limit in (("slowest_slave", 2), ("master", 3)):
            took = figures[f"rolling_{label}_{role}_stop_s"]
            target = f"  <= {limit}" if label == "handover" else ""
            print(
                f"{'  ' + role.replace('_', ' ') + ' SIGTERM to exit, s':<44}{took:>14.2f}{target}"
            )
    print(json.dumps({"bench": "ha", "quick": quick, **figures}))
