"""`capstan controller` as a real process for tests: a YAML config with short timeouts, a
file state store, its log in the test's directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import yaml

from capstan.v1 import controller_pb2 as pb
from capstan.v1 import controller_pb2_grpc as pb_grpc
from tests.broker.broker_process import free_port
from tests.tiers import process_tool
from tests.waiting import wait_until


@process_tool
class ControllerProcess:
    def __init__(
        self, root: Path, state_dir: Path, ca: Path | None = None, **overrides: object
    ) -> None:
        """With `ca`, the helpers below call over TLS trusting it (for `tls` on)."""
        root.mkdir(parents=True, exist_ok=True)
        self.ca = ca
        self.port, self.http_port = free_port(), free_port()
        settings = {
            "listen_host": "127.0.0.1",
            "grpc_port": self.port,
            "http_port": self.http_port,
            "broker_timeout_ms": 1500,
            "check_interval_ms": 200,
            "lease_duration_s": 3,
            "state": {"backend": "file", "directory": str(state_dir)},
        } | overrides
        self.config = root / "controller.yaml"
        self.config.write_text(yaml.safe_dump(settings))
        self.log = root / "controller.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ControllerProcess:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "capstan.cli", "controller", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONSAFEPATH": "1"},
            )
        wait_until(lambda: "is up" in self.log.read_text(), 20, "the controller to start")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # never leave a controller behind, even when the test fails
                self.proc.wait(10)
                raise AssertionError("the controller did not stop on SIGTERM in 20 s") from None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stub(self) -> pb_grpc.ControllerStub:
        if self.ca is None:
            channel = grpc.insecure_channel(self.address)
        else:
            tls = grpc.ssl_channel_credentials(root_certificates=self.ca.read_bytes())
            channel = grpc.secure_channel(self.address, tls)
        return pb_grpc.ControllerStub(channel)  # type: ignore[no-untyped-call]

    def status(self) -> pb.ClusterStatus:
        return self.stub().GetClusterStatus(pb.GetClusterStatusRequest(), timeout=5)

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def group(self, name: str) -> pb.ReplicaInfo:
        return self.stub().GetReplicaInfo(pb.GetReplicaInfoRequest(group=name), timeout=5)
