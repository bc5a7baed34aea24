"""`capstan up`: the embedded default, a local cluster of one controller and broker groups
of a master and slaves, each a child process, until Ctrl-C.

Layout under the data dir: `controller/` (its state), `<group>-<n>/` (one broker's data),
`logs/<name>.log` (each child's output) and `cluster.json` (names, addresses, pids).
Ports: broker k (counting groups first) serves gRPC on `--port + k` and HTTP on
`--http-port + k`; the controller serves gRPC on `--controller-port` and HTTP on the
next HTTP port after the brokers'. `--port` is the clients' access point: its broker
answers routes that name every replica of its group, and passes calls on to the master.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from capstan.v1 import controller_pb2 as pb
from capstan.v1 import controller_pb2_grpc as pb_grpc

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


@dataclass
class Child:
    name: str
    command: list[str]
    log: Path
    address: str
    http_port: int
    group: str = ""
    proc: subprocess.Popen[bytes] | None = None
    reported: bool = field(default=False)

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONSAFEPATH": "1"},
                start_new_session=True,  # Ctrl-C reaches `capstan up`, which stops them in order
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass(frozen=True)
class LocalClusterPlan:
    data_dir: Path
    port: int
    http_port: int
    controller_port: int
    groups: int
    replicas: int
    broker_settings: dict[str, Any]

    def group_name(self, index: int) -> str:
        return f"broker-{chr(ord('a') + index)}" if index < 26 else f"broker-{index}"


class LocalCluster:
    def __init__(self, plan: LocalClusterPlan) -> None:
        self.plan = plan
        self.controller: Child | None = None
        self.brokers: list[Child] = []
        self._stop = threading.Event()

    # -- configs -------------------------------------------------------------------------

    def _write_configs(self) -> None:
        p = self.plan
        p.data_dir.mkdir(parents=True, exist_ok=True)
        controller_http = p.http_port + p.groups * p.replicas
        controller_config = p.data_dir / "controller.yaml"
        controller_config.write_text(
            yaml.safe_dump(
                {
                    "listen_host": "127.0.0.1",
                    "grpc_port": p.controller_port,
                    "http_port": controller_http,
                    "state": {"backend": "file", "directory": str(p.data_dir / "controller")},
                }
            )
        )
        cli = [sys.executable, "-m", "capstan.cli"]
        self.controller = Child(
            "controller",
            [*cli, "controller", "--config", str(controller_config)],
            p.data_dir / "logs" / "controller.log",
            f"127.0.0.1:{p.controller_port}",
            controller_http,
        )
        for g in range(p.groups):
            group = p.group_name(g)
            for r in range(p.replicas):
                k = g * p.replicas + r
                name = f"{group}-{r + 1}"
                settings = dict(p.broker_settings)
                settings.setdefault("listen_host", "127.0.0.1")
                replication = dict(settings.get("replication") or {})
                replication.update(
                    controller_address=f"127.0.0.1:{p.controller_port}", replicas=p.replicas
                )
                settings.update(
                    broker_name=group,
                    data_dir=str(p.data_dir / name),
                    grpc_port=p.port + k,
                    http_port=p.http_port + k,
                    replication=replication,
                )
                config = p.data_dir / f"{name}.yaml"
                config.write_text(yaml.safe_dump(settings))
                self.brokers.append(
                    Child(
                        name,
                        [*cli, "broker", "--config", str(config)],
                        p.data_dir / "logs" / f"{name}.log",
                        f"127.0.0.1:{p.port + k}",
                        p.http_port + k,
                        group,
                    )
                )

    def _write_manifest(self) -> None:
        children = [c for c in [self.controller, *self.brokers] if c is not None]
        manifest = {
            "controller": self.controller.address if self.controller else "",
            "accessPoint": f"127.0.0.1:{self.plan.port}",
            "processes": [
                {
                    "name": c.name,
                    "group": c.group or None,
                    "address": c.address,
                    "metrics": f"http://127.0.0.1:{c.http_port}/metrics",
                    "pid": c.proc.pid if c.proc is not None else None,
                    "log": str(c.log),
                }
                for c in children
            ],
        }
        (self.plan.data_dir / "cluster.json").write_text(json.dumps(manifest, indent=2) + "\n")

    # -- running -------------------------------------------------------------------------

    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self._stop.set())
        self._write_configs()
        assert self.controller is not None
        try:
            self._start(self.controller, "the controller")
            for broker in self.brokers:
                self._start(broker, f"broker {broker.name} of group {broker.group}")
            self._write_manifest()
            if not self._wait_for_masters():
                return 1
            self._announce()
            while not self._stop.wait(1.0):
                self._report_exits()
            print("stopping ...", flush=True)
            return 0
        finally:
            self._stop_all()

    def _start(self, child: Child, what: str) -> None:
        print(f"starting {what} on {child.address} ...", flush=True)
        child.start()

    def _wait_for_masters(self) -> bool:
        """Until every group has a master (progress on the terminal), or a failure."""
        assert self.controller is not None
        stub = pb_grpc.ControllerStub(grpc.insecure_channel(self.controller.address))  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + READY_TIMEOUT_S
        want = {self.plan.group_name(g) for g in range(self.plan.groups)}
        shown = ""
        while time.monotonic() < deadline and not self._stop.is_set():
            dead = [c for c in [self.controller, *self.brokers] if not c.running]
            if dead:
                for c in dead:
                    print(f"error: {c.name} exited; see {c.log}", file=sys.stderr, flush=True)
                return False
            try:
                status = stub.GetClusterStatus(pb.GetClusterStatusRequest(), timeout=2)
                led = {g.group for g in status.groups if g.master_id}
            except grpc.RpcError:
                led = set()
            line = f"waiting for masters: {len(led & want)}/{len(want)} groups led"
            if line != shown:
                print(line, flush=True)
                shown = line
            if want <= led:
                return True
            time.sleep(0.2)
        if not self._stop.is_set():
            print("error: no master elected in time; see the logs", file=sys.stderr, flush=True)
        return False

    def _announce(self) -> None:
        p = self.plan
        assert self.controller is not None
        print("Capstan is up", flush=True)
        print(f"  access point (RocketMQ 5 gRPC) : 127.0.0.1:{p.port}", flush=True)
        print(f"  controller                     : {self.controller.address}", flush=True)
        for b in self.brokers:
            print(
                f"  {b.name:<30} : {b.address}  metrics http://127.0.0.1:{b.http_port}/metrics",
                flush=True,
            )
        print(f"  data                           : {p.data_dir.resolve()}", flush=True)
        print(f"  try: capstan topic create Demo --server 127.0.0.1:{p.port}", flush=True)
        print(f"       capstan cluster status --server {self.controller.address}", flush=True)
        print("Stop with Ctrl-C.", flush=True)

    def _report_exits(self) -> None:
        for c in [self.controller, *self.brokers]:
            if c is not None and not c.running and not c.reported:
                c.reported = True
                code = c.proc.returncode if c.proc is not None else None
                print(f"{c.name} exited (code {code}); see {c.log}", flush=True)

    def _stop_all(self) -> None:
        """Brokers first (they flush and leave cleanly), then the controller."""
        for group in ([b for b in self.brokers if b.running], [self.controller]):
            for c in group:
                if c is not None and c.running and c.proc is not None:
                    c.proc.send_signal(signal.SIGTERM)
            for c in group:
                if c is not None and c.proc is not None:
                    try:
                        c.proc.wait(STOP_TIMEOUT_S)
                    except subprocess.TimeoutExpired:
                        print(f"{c.name} did not stop in time; killing it", flush=True)
                        c.proc.kill()
                        c.proc.wait()
