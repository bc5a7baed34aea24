"""The operator itself (`capstan operator`, the real Kopf runtime, as a subprocess) on a
real control plane, its pods run by the test kubelet as real controller and broker
processes: a BrokerGroup becomes owned children and a running group whose status the
controller fills, a Topic becomes a topic on the brokers, and deleting the BrokerGroup
removes its children through the real garbage collector."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from capstan.v1 import admin_pb2 as pb
from capstan.v1 import admin_pb2_grpc as pb_grpc
from tests.broker.broker_process import free_port
from tests.kube.control_plane import ControlPlane
from tests.kube.kubelet import TestKubelet, hosts_namespace
from tests.operator.test_crds_on_api_server import apply_crds
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


@dataclass
class Cluster:
    plane: ControlPlane
    namespace: str
    kubelet: TestKubelet
    operator: subprocess.Popen[bytes]
    operator_log: Path
    metrics_port: int

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.plane.kubectl("-n", self.namespace, *args, stdin=stdin)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        done = self.kubectl("get", kind, name, "-o", "json")
        return json.loads(done.stdout) if done.returncode == 0 else None

    def apply(self, obj: dict[str, Any]) -> None:
        done = self.kubectl("apply", "-f", "-", stdin=json.dumps(obj))
        assert done.returncode == 0, done.stderr

    def log_tail(self) -> str:
        return self.operator_log.read_text()[-4000:]

    def wait(self, check: Any, timeout_s: float, what: str) -> None:
        """wait_until, with the operator's log in the failure."""
        try:
            wait_until(check, timeout_s, what)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n--- kubelet errors: {self.kubelet.errors[-3:]}"
                f"\n--- operator log:\n{self.log_tail()}"
            ) from None


@pytest.fixture
def cluster(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Cluster]:
    apply_crds(control_plane)
    namespace = f"op-{uuid.uuid4().hex[:8]}"
    assert control_plane.kubectl("create", "namespace", namespace).returncode == 0
    hosts = tmp_path / "hosts"
    bin_dir = Path(sys.executable).parent
    with hosts_namespace(hosts) as enter:
        # A kubelet would mount the pod's service-account token; the test kubelet hands
        # its pods the test's kubeconfig instead (the controller falls back to $KUBECONFIG).
        kubelet = TestKubelet(
            control_plane.api(),
            tmp_path / "kubelet",
            hosts,
            [bin_dir],
            extra_env={"KUBECONFIG": str(control_plane.kubeconfig)},
            command_prefix=enter,
        )
        kubelet.start()
        metrics_port = free_port()
        log_path = tmp_path / "operator.log"
        with log_path.open("wb") as log:
            operator = subprocess.Popen(
                [
                    *enter,
                    str(bin_dir / "capstan"),
                    "--log-level",
                    "DEBUG",
                    "operator",
                    "--namespace",
                    namespace,
                    "--kubeconfig",
                    str(control_plane.kubeconfig),
                    "--listen-host",
                    "127.0.0.1",
                    "--liveness-port",
                    str(free_port()),
                    "--metrics-port",
                    str(metrics_port),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        c = Cluster(control_plane, namespace, kubelet, operator, log_path, metrics_port)
        try:
            yield c
        finally:
            operator.terminate()
            try:
                operator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()
            control_plane.kubectl("delete", "namespace", namespace, "--wait=false")
            kubelet.stop()


def broker_group(name: str, replicas: int, min_in_sync: int) -> dict[str, Any]:
    return {
        "apiVersion": "capstan.io/v1alpha1",
        "kind": "BrokerGroup",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "minInSyncReplicas": min_in_sync,
            "storage": {"size": "1Gi"},
            "brokerConfig": {"store": {"commitlog_segment_bytes": 16 * 1024 * 1024}},
        },
    }


def condition(obj: dict[str, Any] | None, kind: str) -> str:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return str(c["status"])
    return ""


def test_a_broker_group_runs_reports_its_master_and_carries_a_topic(cluster: Cluster) -> None:
    cluster.apply(broker_group("orders", replicas=2, min_in_sync=1))
    owned = {
        "statefulset": "orders",
        "service": "orders",
        "configmap": "orders-config",
        "poddisruptionbudget": "orders",
    }
    for kind, name in owned.items():
        cluster.wait(lambda k=kind, n=name: cluster.get(k, n), 60, f"{kind} {name}")
    group = cluster.get("bg", "orders")
    assert group is not None
    for kind, name in owned.items():
        found = cluster.get(kind, name)
        assert found is not None
        (owner,) = found["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("BrokerGroup", group["metadata"]["uid"])
    assert cluster.get("service", "orders-brokers") is not None
    assert cluster.get("statefulset", "capstan-controller") is not None

    def ready_with_master() -> bool:
        found = cluster.get("bg", "orders")
        return condition(found, "Ready") == "True" and bool(found["status"].get("master"))

    cluster.wait(ready_with_master, 180, "the BrokerGroup Ready with a master")
    status = cluster.get("bg", "orders")["status"]  # type: ignore[index]
    assert status["master"] in ("orders-0", "orders-1") and status["epoch"] >= 1
    assert status["ready"] == "2/2" and status["observedGeneration"] == 1
    listed = cluster.kubectl("get", "bg", "orders").stdout.splitlines()
    assert listed[0].split()[:5] == ["NAME", "READY", "MASTER", "EPOCH", "IN-SYNC"]
    assert listed[1].split()[:3] == ["orders", "2/2", status["master"]]

    cluster.apply(
        {
            "apiVersion": "capstan.io/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": "payments"},
            "spec": {"topicName": "Payments", "brokerGroups": ["orders"], "queues": 4},
        }
    )
    cluster.wait(
        lambda: (
            ((cluster.get("ct", "payments") or {}).get("status") or {}).get("phase") == "InSync"
        ),
        60,
        "the Topic in sync",
    )
    master_ip = cluster.kubelet.pod_ip(cluster.namespace, status["master"])
    with grpc.insecure_channel(f"{master_ip}:8081") as channel:
        described = pb_grpc.AdminStub(channel).DescribeTopic(  # type: ignore[no-untyped-call]
            pb.TopicRequest(name="Payments"), timeout=10
        )
    assert (described.topic.topic.write_queue_nums, described.topic.topic.read_queue_nums) == (4, 4)

    cluster.apply(
        {
            "apiVersion": "capstan.io/v1alpha1",
            "kind": "ConsumerGroup",
            "metadata": {"name": "billing"},
            "spec": {"groupName": "Billing", "brokerGroups": ["orders"], "fifo": True},
        }
    )
    cluster.wait(lambda: condition(cluster.get("cg", "billing"), "Ready") == "True", 60, "group")
    with grpc.insecure_channel(f"{master_ip}:8081") as channel:
        group = pb_grpc.AdminStub(channel).DescribeGroup(  # type: ignore[no-untyped-call]
            pb.GroupRequest(name="Billing"), timeout=10
        )
    assert group.group.group.fifo is True and group.group.group.max_attempts == 17
    found = cluster.get("cg", "billing")
    assert found is not None and found["status"]["totalLag"] == 0

    done = cluster.kubectl("delete", "bg", "orders", "--wait=true", "--timeout=60s")
    assert done.returncode == 0, done.stderr
    wait_until(
        lambda: all(cluster.get(k, n) is None for k, n in owned.items()),
        60,
        "the garbage collector to remove the BrokerGroup's children",
    )


def test_a_topic_on_a_missing_broker_group_is_degraded_naming_the_field(
    cluster: Cluster,
) -> None:
    cluster.apply(
        {
            "apiVersion": "capstan.io/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": "lost"},
            "spec": {"brokerGroups": ["nowhere"]},
        }
    )
    cluster.wait(lambda: condition(cluster.get("ct", "lost"), "Degraded") == "True", 60, "Degraded")
    found = cluster.get("ct", "lost")
    assert found is not None
    (degraded,) = [c for c in found["status"]["conditions"] if c["type"] == "Degraded"]
    assert degraded["reason"] == "BrokerGroupNotFound"
    assert "spec.brokerGroups[0]" in degraded["message"] and "nowhere" in degraded["message"]
    assert cluster.get("statefulset", "capstan-controller") is None
