"""`capstan up`: the embedded default, a local cluster of one controller and broker groups
of a master and slaves, each a child process, until Ctrl-C, SIGTERM or SIGHUP (its
terminal closed), which stop the children in order. Killed any other way, its children
stop themselves (parent_death.py).

Layout under the data dir: `up.lock` (held while `capstan up` runs), `controller/` (its
state), `<group>-<n>/` (one broker's data), `logs/<name>.log` (each child's output) and
`cluster.json` (the access point, names, addresses, current pids).
Ports: broker k (counting groups first) serves gRPC on `--port + k` and HTTP on
`--http-port + k`; the controller serves gRPC on `--controller-port` and HTTP on the
next HTTP port after the brokers'. The controller's address is the clients' access point:
it answers routes naming every replica of every group and passes admin calls to them all.

Before it claims anything it checks the data dir's lock, that no child of an earlier run
still runs, and every port (local_preflight.py).
While up, it restarts a child that dies (restart_policy.py); a dead master is restarted
once the controller has handed its group to another replica, so it rejoins as a slave.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capstan.client.admin import BlockingControllerClient
from capstan.client.errors import ClientError
from capstan.commands.local_children import Child
from capstan.commands.local_preflight import (
    DataDirLock,
    PlannedPort,
    Refused,
    check_leftovers,
    check_ports,
)
from capstan.commands.local_security import SecureFiles
from capstan.commands.restart_policy import QUICK_EXIT_S, GiveUp, after_exit
from capstan.common.signal_stop import SignalStop
from capstan.controller.settings import ControllerSettings
from capstan.v1 import controller_pb2 as pb

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
POLL_S = 0.5
START_SETTLE_S = 5.0
"""After a child died at start, how long the others get to come up or die too, so that
every failing child is reported, not only the first."""
HANDOVER_TIMEOUT_S = 2 * ControllerSettings().broker_timeout_ms / 1000 + 3
"""Longest a dead master's restart waits for the controller to elect another replica."""


@dataclass(frozen=True)
class LocalClusterPlan:
    data_dir: Path
    port: int
    http_port: int
    controller_port: int
    groups: int
    replicas: int
    broker_settings: dict[str, Any]
    secure: SecureFiles | None = None
    """TLS and authentication on every child (`capstan up --secure`); None: open."""

    def group_name(self, index: int) -> str:
        return f"broker-{chr(ord('a') + index)}" if index < 26 else f"broker-{index}"

    @property
    def controller_http_port(self) -> int:
        return self.http_port + self.groups * self.replicas

    def controller_config(self) -> dict[str, Any]:
        return {
            # One name across restarts: a restarted controller renews its own lease at once
            # instead of waiting for the dead process's lease to lapse.
            "controller_id": "capstan-up",
            "listen_host": "127.0.0.1",
            "grpc_port": self.controller_port,
            "http_port": self.controller_http_port,
            "state": {"backend": "file", "directory": str(self.data_dir / "controller")},
            **self._security("controller"),
        }

    def _security(self, kind: str) -> dict[str, Any]:
        if self.secure is None:
            return {}
        auth = (
            self.secure.controller_auth_settings()
            if kind == "controller"
            else self.secure.broker_auth_settings()
        )
        return {"tls": self.secure.tls_settings(), "auth": auth}

    def broker_configs(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(name, group, settings) of every broker, groups first."""
        configs = []
        for g in range(self.groups):
            group = self.group_name(g)
            for r in range(self.replicas):
                k = g * self.replicas + r
                name = f"{group}-{r + 1}"
                settings = dict(self.broker_settings)
                settings.setdefault("listen_host", "127.0.0.1")
                if self.secure is not None:
                    # Known by name, a group is routed as one DOMAIN_NAME address, which a
                    # client's TLS can check against the certificate: gRPC checks a list of
                    # IPv4 addresses against the whole list, which no certificate names.
                    settings.setdefault("advertised_host", "localhost")
                    store = dict(settings.get("store") or {})
                    store.setdefault("store_host", f"127.0.0.1:{self.port + k}")  # an IP
                    settings["store"] = store
                replication = dict(settings.get("replication") or {})
                replication.update(
                    controller_address=f"127.0.0.1:{self.controller_port}", replicas=self.replicas
                )
                settings.update(
                    broker_name=group,
                    data_dir=str(self.data_dir / name),
                    grpc_port=self.port + k,
                    http_port=self.http_port + k,
                    replication=replication,
                    **self._security("broker"),
                )
                configs.append((name, group, settings))
        return configs

    def ports(self) -> list[PlannedPort]:
        """Every port a child will listen on, and what for."""
        ports = [
            PlannedPort("127.0.0.1", self.controller_port, "the controller's gRPC"),
            PlannedPort("127.0.0.1", self.controller_http_port, "the controller's HTTP"),
        ]
        for name, _, s in self.broker_configs():
            ports.append(PlannedPort(s["listen_host"], s["grpc_port"], f"{name}'s gRPC"))
            ports.append(PlannedPort(s["listen_host"], s["http_port"], f"{name}'s HTTP"))
        return ports


class LocalCluster:
    def __init__(self, plan: LocalClusterPlan) -> None:
        self.plan = plan
        cli = [sys.executable, "-m", "capstan.cli"]
        logs = plan.data_dir / "logs"
        self.controller = Child(
            "controller",
            [*cli, "controller", "--config", str(plan.data_dir / "controller.yaml")],
            logs / "controller.log",
            f"127.0.0.1:{plan.controller_port}",
            plan.controller_http_port,
        )
        self.brokers = [
            Child(
                name,
                [*cli, "broker", "--config", str(plan.data_dir / f"{name}.yaml")],
                logs / f"{name}.log",
                f"127.0.0.1:{s['grpc_port']}",
                s["http_port"],
                group,
            )
            for name, group, s in plan.broker_configs()
        ]
        self._stop = SignalStop()
        self._lock = DataDirLock(plan.data_dir)
        self._ca = plan.secure.ca if plan.secure is not None else None
        self._controller = BlockingControllerClient(
            self.controller.address, timeout_s=2, retry_s=0, ca_file=self._ca
        )

    @property
    def children(self) -> list[Child]:
        return [self.controller, *self.brokers]

    def run(self) -> int:
        # SIGHUP: the terminal it runs in was closed.
        self._stop.install((signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
        fresh = not self.plan.data_dir.exists()
        try:
            self._lock.acquire()
            check_leftovers(self.plan.data_dir)
            check_ports(self.plan.ports())
        except Refused as exc:
            self._lock.release(remove=fresh)
            _say(f"error: {exc}", err=True)
            return 1
        try:
            return self._run_claimed()
        finally:
            self._stop_all()
            self._controller.close()
            self._lock.release()

    def _run_claimed(self) -> int:
        self._write_configs()
        _say(f"starting the controller on {self.controller.address} ...")
        self.controller.start()
        self._write_manifest()  # at each start: the next `capstan up` checks these pids
        for b in self.brokers:
            _say(f"starting broker {b.name} of group {b.group} on {b.address} ...")
            b.start()
            self._write_manifest()
        if not self._wait_until_up():
            return 0 if self._stop.is_set() else 1
        self._announce()
        while not self._stop.wait(POLL_S):
            if not self._supervise():
                _say("error: every process of the cluster was given up on", err=True)
                return 1
        _say("stopping ...")
        return 0

    # -- files -----------------------------------------------------------------------------

    def _write_configs(self) -> None:
        d = self.plan.data_dir
        (d / "controller.yaml").write_text(yaml.safe_dump(self.plan.controller_config()))
        for name, _, settings in self.plan.broker_configs():
            (d / f"{name}.yaml").write_text(yaml.safe_dump(settings))

    def _write_manifest(self) -> None:
        manifest = {
            "access_point": self.controller.address,
            "controller": self.controller.address,
            "processes": [
                {
                    "name": c.name,
                    "group": c.group or None,
                    "address": c.address,
                    "metrics": f"{self._http_scheme}://127.0.0.1:{c.http_port}/metrics",
                    "pid": c.pid,
                    "restarts": c.history.restarts,
                    "log": str(c.log),
                }
                for c in self.children
            ],
        }
        path = self.plan.data_dir / "cluster.json"
        partial = path.with_suffix(".json.tmp")
        partial.write_text(json.dumps(manifest, indent=2) + "\n")
        partial.replace(path)  # readers never see half a file

    # -- starting ----------------------------------------------------------------------------

    def _wait_until_up(self) -> bool:
        """Until every child serves, every broker beats to the controller and every group
        has a live master (progress on the terminal), or a child died, or time ran out."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        want = {self.plan.group_name(g) for g in range(self.plan.groups)}
        serving: set[str] = set()
        shown = ""
        while time.monotonic() < deadline and not self._stop.is_set():
            if any(not c.running for c in self.children):
                self._report_start_failures()
                return False
            serving |= {
                c.name
                for c in self.children
                if c.name not in serving and _serving(c.address, self._ca)
            }
            groups = [g for g in self._groups() if g.group in want]
            led = {g.group for g in groups if _has_live_master(g)}
            registered = sum(sum(r.alive for r in g.replicas) for g in groups)
            expected = len(self.brokers)
            line = (
                f"waiting for masters: {len(led)}/{len(want)} groups led, "
                f"{registered}/{expected} brokers registered"
            )
            if line != shown:
                _say(line)
                shown = line
            if led == want and registered >= expected and len(serving) == len(self.children):
                return True
            self._stop.wait(0.2)
        if not self._stop.is_set():
            _say("error: no master elected in time; see the logs", err=True)
        return False

    def _report_start_failures(self) -> None:
        """One line for each child that died, once the others have come up or died too."""
        deadline = time.monotonic() + START_SETTLE_S
        while time.monotonic() < deadline and not all(
            not c.running or _serving(c.address, self._ca) for c in self.children
        ):
            time.sleep(0.2)
        for c in self.children:
            if not c.running:
                _say(f"error: {c.name} exited ({c.exit_summary()}); log {c.log}", err=True)

    @property
    def _http_scheme(self) -> str:
        """--secure serves the metrics ports over HTTPS too."""
        return "http" if self.plan.secure is None else "https"

    def _announce(self) -> None:
        access = self.controller.address
        scheme = self._http_scheme
        rows = [
            ("access point (RocketMQ 5 gRPC, every group)", access),
            ("controller metrics", f"{scheme}://127.0.0.1:{self.controller.http_port}/metrics"),
            *[
                (f"{b.name}", f"{b.address}  metrics {scheme}://127.0.0.1:{b.http_port}/metrics")
                for b in self.brokers
            ],
            ("data", str(self.plan.data_dir.resolve())),
        ]
        width = max(len(label) for label, _ in rows)
        _say("Capstan is up")
        for label, value in rows:
            _say(f"  {label:<{width}} : {value}")
        secure = self.plan.secure
        if secure is None:
            _say(
                "  open for local development: no TLS, no authentication "
                "(capstan up --secure turns both on)"
            )
        else:
            _say(f"  TLS on every port, CA         : {secure.ca.resolve()}")
            _say(f"  authentication on, super user : {secure.admin_credentials.resolve()}")
            _say(f"  use: export CAPSTAN_CA={secure.ca.resolve()}")
            _say(f"       export CAPSTAN_CREDENTIALS={secure.admin_credentials.resolve()}")
        _say(f"  try: capstan topic create Demo --server {access}")
        _say(f"       capstan produce Demo --body hello --server {access}")
        _say(f"       capstan cluster status --server {access}")
        _say("Stop with Ctrl-C.")

    # -- supervising ---------------------------------------------------------------------

    def _supervise(self) -> bool:
        """Notice exits, restart what is due; False once every child was given up on."""
        now = time.monotonic()
        for c in self.children:
            if c.running or c.given_up:
                continue
            if c.restart_at is None:
                self._decide(c, now)
            elif now >= c.restart_at and not self._handover_pending(c, now):
                c.start()
                self._write_manifest()
                _say(f"{c.name} restarted (pid {c.pid}, restart {c.history.restarts})")
        return not all(c.given_up for c in self.children)

    def _decide(self, c: Child, now: float) -> None:
        decision = after_exit(c.history, now - c.started_at)
        c.history = decision.history
        summary = c.exit_summary()
        self._write_manifest()
        if isinstance(decision, GiveUp):
            c.given_up = True
            _say(
                f"error: {c.name} exited ({summary}), {decision.history.quick_exits} times in a "
                f"row within {QUICK_EXIT_S:.0f} s of its start; not restarting it; log {c.log}",
                err=True,
            )
            return
        c.restart_at = now + decision.delay_s
        when = f"in {decision.delay_s:.0f} s"
        c.handover_until = None
        if c.group and self.plan.replicas > 1 and self._master_port(c.group) == c.port:
            c.handover_until = now + HANDOVER_TIMEOUT_S
            when = f"once another replica leads {c.group}"
        _say(
            f"{c.name} exited ({summary}); restarting it {when} "
            f"(restart {c.history.restarts}); log {c.log}"
        )

    def _handover_pending(self, c: Child, now: float) -> bool:
        """Whether the controller still names this dead master (and may yet elect another):
        restarted before that, it would lead again instead of following the new master."""
        if c.handover_until is None or now >= c.handover_until:
            return False
        if self._master_port(c.group) == c.port:
            return True
        c.handover_until = None
        return False

    def _groups(self) -> list[pb.ReplicaInfo]:
        try:
            status = self._controller.cluster_status()
        except ClientError:
            return []
        return list(status.groups)

    def _master_port(self, group: str) -> int | None:
        for info in self._groups():
            if info.group == group and info.master_address:
                return int(info.master_address.rsplit(":", 1)[1])
        return None

    # -- stopping ------------------------------------------------------------------------

    def _stop_all(self) -> None:
        """The slaves first (each leaves its SyncStateSet as it goes), then the masters
        (with nobody in sync left to hand over to, they stop at once), then the controller.
        When the controller cannot say who leads, every broker at once."""
        masters = {info.master_address for info in self._groups()}
        slaves = [b for b in self.brokers if b.address not in masters]
        leaders = [b for b in self.brokers if b.address in masters]
        for group in (slaves, leaders, [self.controller]):
            for c in group:
                c.terminate()
            for c in group:
                if not c.wait_stopped(STOP_TIMEOUT_S):
                    _say(f"{c.name} did not stop in time; killed it")


def _say(line: str, err: bool = False) -> None:
    """A line on the terminal, or nowhere once the terminal is gone (closed: EIO; a reader
    of the pipe gone: EPIPE), so that a stop on SIGHUP still goes on to its end."""
    stream = sys.stderr if err else sys.stdout
    try:
        print(line, file=stream, flush=True)
    except OSError:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), stream.fileno())  # what is left in its buffer goes too


def _has_live_master(info: pb.ReplicaInfo) -> bool:
    """The controller keeps the last master named across restarts; alive means it beats."""
    return any(r.broker_id == info.master_id and r.alive for r in info.replicas)


def _serving(address: str, ca: Path | None) -> bool:
    if ca is None:
        channel = grpc.insecure_channel(address)
    else:
        tls = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
        channel = grpc.secure_channel(address, tls)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=0.5
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
