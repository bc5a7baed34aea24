"""A real broker process on 127.0.0.1 for integration tests: start, SIGTERM, kill -9."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capstan.security.signature import Credentials, signed_metadata
from capstan.v1 import admin_pb2 as admin
from capstan.v1 import admin_pb2_grpc as admin_grpc
from tests.tiers import process_tool

# Short timings so redelivery, check-back and dead-lettering happen within a test.
TEST_SETTINGS: dict[str, Any] = {
    "listen_host": "127.0.0.1",
    "http_port": 0,
    "shutdown_grace_s": 2,
    "pop": {"min_invisible_ms": 1000, "max_long_polling_ms": 5000},
    "transaction": {"check_timeout_ms": 1000, "check_interval_ms": 500, "max_checks": 3},
    "store": {
        "commitlog_segment_bytes": 4 * 1024 * 1024,
        "flush_mode": "SYNC_FLUSH",
        "index": {"hash_slots_per_file": 4096, "index_entries_per_file": 16384},
    },
}


class _CallMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Adds entries to every call: the forwarded mark (so a replica answers from its own
    state) and, with credentials, a fresh signature."""

    def __init__(self, here: bool, credentials: Credentials | None) -> None:
        self._here = here
        self._credentials = credentials

    def _marked(self, details: Any) -> Any:
        metadata = list(details.metadata or ())
        if self._here:
            metadata.append(("x-capstan-forwarded", "1"))
        if self._credentials is not None:
            metadata += signed_metadata(self._credentials)
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._marked(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._marked(details), request)


def open_channel(
    address: str,
    here: bool = False,
    credentials: Credentials | None = None,
    ca: Path | None = None,
) -> grpc.Channel:
    """A channel to `address`; with `here`, calls are answered by that broker itself even
    when it is a replica that would pass them on to its master; with `credentials`, each
    call is signed; with `ca`, over TLS trusting that CA."""
    if ca is None:
        channel = grpc.insecure_channel(address)
    else:
        tls = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
        channel = grpc.secure_channel(address, tls)
    if not here and credentials is None:
        return channel
    return grpc.intercept_channel(channel, _CallMetadata(here, credentials))


_HANDED_OUT: set[int] = set()
"""Ports free_port gave this test process: the kernel may offer a closed one again at once,
and two picked before either is bound would then clash (seen: an operator's health and
webhook ports)."""


def free_port() -> int:
    """A port nothing listens on now, never one this process was given before."""
    return free_port_run(1)


RUN_PORTS = range(12000, 23000)
"""Where test ports come from: under the kernel's ephemeral range (32768 up here, and Linux's
default) so no outgoing connection's local end takes one between the check and the child's
bind, or while a killed broker is down before it restarts on its port (seen in CI, with the
e2e story beside the tests); under the real node's fixed ports (23000-29999: its etcd, API
server, scheduler and controller manager, tests/kube/node.py) and Kubernetes' NodePorts
(30000 up) that the node's kube-proxy holds."""


def own_ports() -> range:
    """This process's share of RUN_PORTS: each pytest-xdist worker has its own and any other
    process (a run without workers, the e2e story) the last, so two processes never probe
    the same port at once."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else workers
    size = len(RUN_PORTS) // (workers + 1)
    first = RUN_PORTS.start + min(index, workers) * size
    return range(first, first + size)


def free_port_run(count: int) -> int:
    """The first of `count` consecutive ports nothing listens on and this process was never
    given, for a child that listens on `first + k`."""
    ports = own_ports()
    pick = random.SystemRandom()
    while True:
        first = pick.randrange(ports.start, ports.stop - count)
        run = range(first, first + count)
        if _HANDED_OUT.isdisjoint(run) and all(_free(p) for p in run):
            _HANDED_OUT.update(run)
            return first


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@process_tool
class BrokerProcess:
    def __init__(
        self,
        root: Path,
        credentials: Credentials | None = None,
        ca: Path | None = None,
        **overrides: Any,
    ) -> None:
        """`credentials` sign the admin calls of the helpers below; with `ca`, the helpers
        call over TLS trusting it (for a broker with `tls` on)."""
        self.root = root
        self.credentials = credentials
        self.ca = ca
        self.port = free_port()
        self.http_port = free_port()
        settings = {**TEST_SETTINGS, **overrides}
        settings.update(data_dir=str(root / "data"), grpc_port=self.port, http_port=self.http_port)
        self.config = root / "broker.yaml"
        self.config.write_text(yaml.safe_dump(settings))
        self.log = root / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30) -> BrokerProcess:
        env = {**os.environ, "PYTHONSAFEPATH": "1"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "capstan.cli",
                    "--log-level",
                    "INFO",
                    "broker",
                    "--config",
                    str(self.config),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.wait_serving(timeout_s)
        return self

    def wait_serving(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with open_channel(self.address, ca=self.ca) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RuntimeError(f"broker exited: {self.log.read_text()[-3000:]}")
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        raise TimeoutError(f"broker not serving: {self.log.read_text()[-3000:]}")

    def stop(self, timeout_s: float = 20) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # never leave a broker behind, even when the test fails
            self.proc.wait(10)
            tail = self.log.read_text(errors="replace")[-6000:]
            raise AssertionError(
                f"broker did not stop on SIGTERM in {timeout_s} s:\n{tail}"
            ) from None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def admin(self, here: bool = False) -> admin_grpc.AdminStub:
        return admin_grpc.AdminStub(open_channel(self.address, here, self.credentials, self.ca))

    def create_topic(
        self, name: str, kind: str = "NORMAL", queues: int = 4, compact: bool = False
    ) -> None:
        self.admin().CreateTopic(
            admin.Topic(
                name=name,
                type=admin.TopicType.Value(kind),
                read_queue_nums=queues,
                write_queue_nums=queues,
                attributes={"cleanup.policy": "COMPACT"} if compact else {},
            ),
            timeout=10,
        )

    def create_group(self, name: str, fifo: bool = False, max_attempts: int = 0) -> None:
        self.admin().CreateGroup(
            admin.Group(name=name, fifo=fifo, max_attempts=max_attempts), timeout=10
        )

    def queue_ends(self, topic: str, here: bool = False) -> list[int]:
        reply = self.admin(here).DescribeTopic(admin.TopicRequest(name=topic), timeout=10)
        return [q.max_offset for q in reply.topic.queues]

    def queue_ends_once_made(self, topic: str, here: bool = False) -> list[int]:
        """`queue_ends`, or [] while the topic does not exist yet (a DLQ is made with its
        first message; a slave learns a topic from its master a moment after it is made)."""
        try:
            return self.queue_ends(topic, here)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return []

    def dead_letters(self, group: str) -> int:
        """Messages in the group's DLQ; 0 before the first."""
        return sum(self.queue_ends_once_made(f"%DLQ%{group}"))
