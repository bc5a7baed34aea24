"""The operator itself (`capstan operator`, the real Kopf runtime, as a subprocess) on a
real control plane, its pods run by the test kubelet as real controller and broker
processes: a BrokerGroup becomes owned children and a running group whose status the
controller fills, a Topic becomes a topic on the brokers, and deleting the BrokerGroup
removes its children through the real garbage collector."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from kubernetes import client
from rocketmq.grpc_protocol import definition_pb2 as v2pb

from capstan.v1 import admin_pb2 as pb
from capstan.v1 import admin_pb2_grpc as pb_grpc
from capstan.v1 import controller_pb2 as cpb
from capstan.v1.controller_pb2_grpc import ControllerStub
from tests.broker.broker_process import free_port
from tests.broker.v2_requests import send_to_queue, stub, v2_message
from tests.kube.control_plane import ControlPlane
from tests.kube.kubelet import TestKubelet, running_kubelet
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
    enter: list[str]
    """The prefix that runs a command inside the pods' hosts namespace."""

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
    with running_operator(control_plane, tmp_path, namespaces=1) as c:
        yield c


@contextlib.contextmanager
def running_operator(
    control_plane: ControlPlane, tmp_path: Path, namespaces: int
) -> Iterator[Cluster]:
    """The test kubelet and `capstan operator` watching `namespaces` new namespaces."""
    apply_crds(control_plane)
    watched = [f"op-{uuid.uuid4().hex[:8]}" for _ in range(namespaces)]
    for namespace in watched:
        assert control_plane.kubectl("create", "namespace", namespace).returncode == 0
    bin_dir = Path(sys.executable).parent
    # Pods act with their service accounts' rights (the controller with its Role).
    with running_kubelet(control_plane.api(), tmp_path) as (kubelet, enter):
        metrics_port = free_port()
        cert, key = tmp_path / "webhook.crt", tmp_path / "webhook.key"
        made = subprocess.run(
            [
                *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
                *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
                *("-addext", "subjectAltName=IP:127.0.0.1"),
            ],
            capture_output=True,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
        log_path = tmp_path / "operator.log"
        with log_path.open("wb") as log:
            operator = subprocess.Popen(
                [
                    *enter,
                    str(bin_dir / "capstan"),
                    "--log-level",
                    "DEBUG",
                    "operator",
                    *(arg for n in watched for arg in ("--namespace", n)),
                    "--kubeconfig",
                    str(control_plane.kubeconfig),
                    "--listen-host",
                    "127.0.0.1",
                    "--liveness-port",
                    str(free_port()),
                    "--metrics-port",
                    str(metrics_port),
                    "--webhook-port",
                    str(free_port()),
                    "--webhook-host",
                    "127.0.0.1",
                    "--webhook-cert",
                    str(cert),
                    "--webhook-key",
                    str(key),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        c = Cluster(control_plane, watched[0], kubelet, operator, log_path, metrics_port, enter)
        try:
            yield c
        finally:
            operator.terminate()
            try:
                operator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()
            for namespace in watched:
                control_plane.kubectl("delete", "namespace", namespace, "--wait=false")


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


def topic_phase(cluster: Cluster, name: str) -> str:
    return str(((cluster.get("ct", name) or {}).get("status") or {}).get("phase"))


def apply_topic_in_sync(cluster: Cluster, name: str, topic_name: str, group: str) -> None:
    """A Topic of four queues on one BrokerGroup, once the operator has it on the brokers."""
    cluster.apply(
        {
            "apiVersion": "capstan.io/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": name},
            "spec": {"topicName": topic_name, "brokerGroups": [group], "queues": 4},
        }
    )
    cluster.wait(lambda: topic_phase(cluster, name) == "InSync", 60, f"Topic {name} in sync")


def webhook_serves(cluster: Cluster) -> bool:
    """The operator has registered its four webhooks with the API server."""
    done = cluster.plane.kubectl("get", "validatingwebhookconfiguration", "capstan.io", "-oyaml")
    found = yaml.safe_load(done.stdout) if done.returncode == 0 else None
    return len((found or {}).get("webhooks") or []) >= 4


def status_and_reason(obj: dict[str, Any] | None, kind: str) -> tuple[str, str]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return str(c["status"]), str(c.get("reason", ""))
    return "", ""


def condition(obj: dict[str, Any] | None, kind: str) -> str:
    return status_and_reason(obj, kind)[0]


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

    apply_topic_in_sync(cluster, "payments", "Payments", "orders")
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

    # A hung controller: the operator cannot tell how the group is doing, says so, and
    # finds it again once the controller answers, with the same master at the same epoch.
    held = (status["master"], status["epoch"])
    assert cluster.kubelet.signal(cluster.namespace, "capstan-controller-0", signal.SIGSTOP)
    try:
        unknown = ("Unknown", "ControllerUnreachable")
        cluster.wait(
            lambda: status_and_reason(cluster.get("bg", "orders"), "Ready") == unknown,
            60,
            "Ready Unknown, the controller unreachable",
        )
    finally:
        cluster.kubelet.signal(cluster.namespace, "capstan-controller-0", signal.SIGCONT)
    cluster.wait(ready_with_master, 120, "the BrokerGroup Ready again")
    status = cluster.get("bg", "orders")["status"]  # type: ignore[index]
    assert (status["master"], status["epoch"]) == held

    # The controller's pod replaced: its state lives in the API server, so nothing changes.
    controller = cluster.get("pod", "capstan-controller-0")
    assert controller is not None
    done = cluster.kubectl("delete", "pod", "capstan-controller-0", "--timeout=60s")
    assert done.returncode == 0, done.stderr

    def controller_replaced() -> bool:
        now = cluster.get("pod", "capstan-controller-0") or {"metadata": {}}
        return now["metadata"].get("uid") not in (None, controller["metadata"]["uid"]) and (
            condition(now, "Ready") == "True"
        )

    cluster.wait(controller_replaced, 90, "a new, ready controller pod")
    cluster.wait(ready_with_master, 120, "the BrokerGroup Ready with the new controller")
    status = cluster.get("bg", "orders")["status"]  # type: ignore[index]
    assert (status["master"], status["epoch"]) == held

    # The group holds messages nobody consumed: the webhook keeps it until told otherwise.
    cluster.wait(lambda: webhook_serves(cluster), 60, "the ValidatingWebhookConfiguration")
    for i in range(3):
        sent = send_to_queue(stub(f"{master_ip}:8081"), "0", v2_message("Payments", b"%d" % i))
        assert sent[0].status.code == v2pb.OK
    done = cluster.kubectl("delete", "bg", "orders", "--wait=true", "--timeout=60s")
    assert done.returncode != 0
    assert "the group still holds 3 unconsumed message(s)" in done.stderr, done.stderr
    assert cluster.get("bg", "orders") is not None
    marked = cluster.kubectl("annotate", "bg", "orders", "capstan.io/delete-with-messages=true")
    assert marked.returncode == 0, marked.stderr
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


def test_the_webhook_refuses_a_spec_that_breaks_a_rule_naming_the_field(
    cluster: Cluster,
) -> None:
    cluster.wait(lambda: webhook_serves(cluster), 60, "the ValidatingWebhookConfiguration")
    bad = broker_group("bad", replicas=2, min_in_sync=3)
    done = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(bad))
    assert done.returncode != 0
    assert "spec.minInSyncReplicas: minInSyncReplicas must not exceed replicas" in done.stderr
    typo = broker_group("typo", replicas=1, min_in_sync=1)
    typo["spec"]["brokerConfig"] = {"store": {"flush_mod": "SYNC_FLUSH"}}
    done = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(typo))
    assert done.returncode != 0 and "unknown setting store.flush_mod" in done.stderr
    assert cluster.get("bg", "bad") is None and cluster.get("bg", "typo") is None

    topic = {
        "apiVersion": "capstan.io/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": "renamed"},
        "spec": {"topicName": "First", "brokerGroups": ["somewhere"]},
    }
    cluster.apply(topic)
    topic["spec"]["topicName"] = "Second"
    done = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(topic))
    assert done.returncode != 0 and "spec.topicName: topicName is immutable" in done.stderr
    found = cluster.get("ct", "renamed")
    assert found is not None and found["spec"]["topicName"] == "First"


@dataclass
class Sample:
    at: float
    master: str
    epoch: int
    in_sync: int
    pods: dict[str, str]
    """Pod name -> uid: a new uid is a restart."""
    leader: str
    """The master's pod as the controller has it now ("" if it did not answer): the
    status is written on the operator's next tick, the controller knows at once."""


def test_a_spec_change_rolls_slaves_first_then_moves_the_master_while_sends_go_on(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.apply(broker_group("roll", replicas=3, min_in_sync=2))
    cluster.wait(lambda: condition(cluster.get("bg", "roll"), "Ready") == "True", 180, "roll Ready")
    apply_topic_in_sync(cluster, "rolling", "Rolling", "roll")
    sends, stop = tmp_path / "sends.tsv", tmp_path / "stop"
    with (tmp_path / "sender.log").open("wb") as sender_log:
        sender = subprocess.Popen(
            [
                *cluster.enter,
                sys.executable,
                "-P",
                str(Path(__file__).with_name("official_sender.py")),
                f"roll.{cluster.namespace}.svc:8081",
                "Rolling",
                str(sends),
                str(stop),
            ],
            stdout=subprocess.DEVNULL,
            stderr=sender_log,
        )
    samples: list[Sample] = []
    custom = client.CustomObjectsApi(cluster.plane.api())
    core = client.CoreV1Api(cluster.plane.api())

    def sample() -> Sample:
        group = custom.get_namespaced_custom_object(
            "capstan.io", "v1alpha1", cluster.namespace, "brokergroups", "roll"
        )
        status = group.get("status") or {}
        pods = core.list_namespaced_pod(
            cluster.namespace, label_selector="app.kubernetes.io/instance=roll"
        ).items
        found = Sample(
            time.monotonic(),
            status.get("master", ""),
            int(status.get("epoch", 0)),
            int(status.get("inSyncReplicas", 0)),
            {p.metadata.name: p.metadata.uid for p in pods},
            controller_master(cluster, "roll"),
        )
        samples.append(found)
        return found

    try:
        cluster.wait(lambda: _acked(sends) >= 20, 60, "the first acknowledged sends")
        before = sample()
        patch = {"spec": {"brokerConfig": {"pop": {"max_batch_size": 16}}}}
        done = cluster.kubectl("patch", "bg", "roll", "--type=merge", "-p", json.dumps(patch))
        assert done.returncode == 0, done.stderr

        def rolled() -> bool:
            now = sample()
            group = cluster.get("bg", "roll") or {}
            return (
                len(now.pods) == 3
                and all(now.pods[p] != before.pods[p] for p in before.pods)
                and (group.get("status") or {}).get("observedGeneration") == 2
                and condition(group, "Ready") == "True"
            )

        cluster.wait(lambda: rolled() or time.sleep(0.5), 300, "every pod rolled")
        rolled_at = time.monotonic()

        # Below minInSyncReplicas is refused at the door, naming the field.
        too_few = {"spec": {"replicas": 1}}
        done = cluster.kubectl("patch", "bg", "roll", "--type=merge", "-p", json.dumps(too_few))
        assert done.returncode != 0 and "spec.minInSyncReplicas" in done.stderr
        # One fewer: the last pod goes (after the master, if it was there, moved off it).
        fewer = {"spec": {"replicas": 2}}
        done = cluster.kubectl("patch", "bg", "roll", "--type=merge", "-p", json.dumps(fewer))
        assert done.returncode == 0, done.stderr

        def scaled_down() -> bool:
            now = sample()
            group = cluster.get("bg", "roll") or {}
            sts = cluster.get("statefulset", "roll") or {}
            return (
                set(now.pods) == {"roll-0", "roll-1"}
                and sts.get("spec", {}).get("replicas") == 2
                and condition(group, "Ready") == "True"
                and (group.get("status") or {}).get("ready") == "2/2"
            )

        cluster.wait(lambda: scaled_down() or time.sleep(0.5), 120, "the scale-down to 2")
        time.sleep(2)
    finally:
        stop.touch()
        sender.wait(timeout=60)
    outcomes = [
        (float(at), ok == "1")
        for at, ok in (line.split("\t") for line in sends.read_text().split("\n") if line)
    ]
    restarts: list[tuple[float, str, str]] = []  # (seen back, pod, master when it went)
    last_seen: dict[str, tuple[str, str]] = {}  # pod -> (uid, the controller's master then)
    for s in (s for s in samples if s.at <= rolled_at):
        for pod, uid in s.pods.items():
            if pod in last_seen and last_seen[pod][0] != uid:
                restarts.append((s.at, pod, last_seen[pod][1]))
            last_seen[pod] = (uid, s.leader)
    order = [pod for _, pod, _ in restarts]
    old_master = before.master
    assert sorted(order) == ["roll-0", "roll-1", "roll-2"], restarts
    assert order[-1] == old_master, f"the master {old_master} must restart last: {order}"
    last = restarts[-1]
    assert last[2] != old_master, "the master moved before its pod restarted"
    assert min(s.in_sync for s in samples) >= 2, [s.in_sync for s in samples]
    assert samples[-1].epoch > before.epoch
    assert samples[-1].master in ("roll-0", "roll-1")
    figures = _outage(outcomes)
    print(json.dumps({"rolling_change": figures}))
    assert figures["sends"] > 50
    assert figures["longest_outage_s"] < 10.0, figures


def controller_master(cluster: Cluster, group: str) -> str:
    """The pod the namespace's controller has as `group`'s master, "" if it did not say."""
    ip = cluster.kubelet.pod_ip(cluster.namespace, "capstan-controller-0")
    if ip is None:
        return ""
    try:
        with grpc.insecure_channel(f"{ip}:9876") as channel:
            info = ControllerStub(channel).GetReplicaInfo(  # type: ignore[no-untyped-call]
                cpb.GetReplicaInfoRequest(group=group), timeout=2
            )
    except grpc.RpcError:
        return ""
    return str(info.master_address).split(".", 1)[0]


def _acked(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().split("\n") if line.endswith("\t1"))


def _outage(outcomes: list[tuple[float, bool]]) -> dict[str, float]:
    from capstan.bench.ha_rolling import Sends

    sends = Sends(outcomes)
    return {
        "sends": float(len(outcomes)),
        "failed_sends": float(sends.failed),
        "longest_outage_s": round(sends.longest_outage_s(), 3),
    }


def test_fewer_queues_go_in_two_phases_and_a_deleted_topic_leaves_the_brokers(
    cluster: Cluster,
) -> None:
    cluster.apply(broker_group("shrink", replicas=1, min_in_sync=1))
    cluster.wait(
        lambda: condition(cluster.get("bg", "shrink"), "Ready") == "True", 180, "shrink Ready"
    )
    topic = {
        "apiVersion": "capstan.io/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": "shrinking"},
        "spec": {"topicName": "Shrinking", "brokerGroups": ["shrink"], "queues": 4},
    }
    cluster.apply(topic)

    def phase() -> str:
        return topic_phase(cluster, "shrinking")

    cluster.wait(lambda: phase() == "InSync", 60, "the Topic in sync")
    master_ip = cluster.kubelet.pod_ip(cluster.namespace, "shrink-0")
    address = f"{master_ip}:8081"
    reply, _ = send_to_queue(stub(address), "3", v2_message("Shrinking", b"late"))
    assert reply.status.code == v2pb.OK, reply.status
    with grpc.insecure_channel(address) as channel:
        admin = pb_grpc.AdminStub(channel)  # type: ignore[no-untyped-call]
        admin.CreateGroup(pb.Group(name="Reader", consume_enable=True), timeout=10)
        admin.ResetOffset(pb.ResetOffsetRequest(group="Reader", topic="Shrinking", earliest=True))

        def queues() -> tuple[int, int]:
            t = admin.DescribeTopic(pb.TopicRequest(name="Shrinking"), timeout=10).topic.topic
            return t.write_queue_nums, t.read_queue_nums

        # Drift on the brokers is found by the timer and written back (the resource wins).
        admin.UpdateTopic(
            pb.Topic(name="Shrinking", type=pb.NORMAL, read_queue_nums=4, write_queue_nums=1),
            timeout=10,
        )
        cluster.wait(lambda: queues() == (4, 4), 60, "the drift repaired")

        topic["spec"]["queues"] = 2
        cluster.apply(topic)
        cluster.wait(lambda: phase() == "ShrinkingReadQueues", 60, "the read-queue phase")
        assert queues() == (2, 4)  # queue 3 still holds a message Reader has not consumed
        found = cluster.get("ct", "shrinking")
        assert found is not None
        (entry,) = found["status"]["brokerGroups"]
        assert "queue(s) 3 are consumed" in entry["message"]
        admin.ResetOffset(pb.ResetOffsetRequest(group="Reader", topic="Shrinking", latest=True))
        cluster.wait(lambda: phase() == "InSync", 60, "the read queues to follow")
        assert queues() == (2, 2)

        done = cluster.kubectl("delete", "ct", "shrinking", "--timeout=60s")
        assert done.returncode == 0, done.stderr
        with pytest.raises(grpc.RpcError) as gone:
            admin.DescribeTopic(pb.TopicRequest(name="Shrinking"), timeout=10)
        assert gone.value.code() is grpc.StatusCode.NOT_FOUND


def test_one_operator_runs_broker_groups_in_several_namespaces(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    with running_operator(control_plane, tmp_path, namespaces=2) as cluster:
        namespaces = _watched(cluster)
        assert len(namespaces) == 2
        for namespace in namespaces:
            done = control_plane.kubectl(
                "apply",
                "-n",
                namespace,
                "-f",
                "-",
                stdin=json.dumps(broker_group("solo", replicas=1, min_in_sync=1)),
            )
            assert done.returncode == 0, done.stderr

        def every_group_ready() -> bool:
            for namespace in namespaces:
                done = control_plane.kubectl("get", "bg", "solo", "-n", namespace, "-o", "json")
                if done.returncode != 0 or condition(json.loads(done.stdout), "Ready") != "True":
                    return False
            return True

        cluster.wait(every_group_ready, 180, "a Ready BrokerGroup in each namespace")
        with urllib.request.urlopen(
            f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=10
        ) as reply:
            metrics = reply.read().decode()
        assert (
            'capstan_operator_reconcile_seconds_count{kind="BrokerGroup",outcome="ok"}' in metrics
        )


def _watched(cluster: Cluster) -> list[str]:
    args = cluster.operator.args
    assert isinstance(args, list)
    return [str(args[i + 1]) for i, a in enumerate(args) if a == "--namespace"]


def run_cronjob_now(cluster: Cluster, cronjob: str, job: str) -> None:
    """Start a run of a CronJob now, as `kubectl create job --from=cronjob/...` does (that
    kubectl asks for batch/v1, which a 1.20 server does not serve): a Job of its template."""
    found = cluster.get("cronjob", cronjob)
    assert found is not None, f"no CronJob {cronjob}"
    template = found["spec"]["jobTemplate"]
    cluster.apply(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": job, "labels": template.get("metadata", {}).get("labels", {})},
            "spec": template["spec"],
        }
    )


def test_a_compact_topic_and_an_audited_group_run_their_jobs_and_report_in_status(
    cluster: Cluster,
) -> None:
    group = broker_group("tables", replicas=2, min_in_sync=1)
    group["spec"]["audit"] = {"schedule": "*/30 * * * *"}
    cluster.apply(group)

    def ready_with_master() -> bool:
        found = cluster.get("bg", "tables")
        return condition(found, "Ready") == "True" and bool(found["status"].get("master"))

    cluster.wait(ready_with_master, 180, "the BrokerGroup Ready with a master")
    cluster.apply(
        {
            "apiVersion": "capstan.io/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": "prices"},
            "spec": {
                "topicName": "Prices",
                "brokerGroups": ["tables"],
                "queues": 2,
                "cleanupPolicy": "compact",
                "compaction": {"schedule": "0 3 * * *", "tombstoneRetentionMs": 0},
            },
        }
    )
    cluster.wait(lambda: topic_phase(cluster, "prices") == "InSync", 60, "the Topic in sync")
    cluster.wait(lambda: cluster.get("cronjob", "prices-compaction"), 30, "the compaction CronJob")
    cronjob = cluster.get("cronjob", "prices-compaction")
    assert cronjob is not None
    assert cronjob["spec"]["schedule"] == "0 3 * * *"
    [container] = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["command"][:4] == ["capstan", "spark", "compact", "Prices"]
    assert cronjob["metadata"]["ownerReferences"][0]["kind"] == "Topic"
    audit_job = cluster.get("cronjob", "tables-audit")
    assert audit_job is not None and audit_job["spec"]["schedule"] == "*/30 * * * *"

    master = cluster.get("bg", "tables")["status"]["master"]  # type: ignore[index]
    s = stub(f"{cluster.kubelet.pod_ip(cluster.namespace, master)}:8081")
    for i in range(60):
        reply, _ = send_to_queue(
            s, str(i % 2), v2_message("Prices", f"v{i}".encode(), keys=[f"k{i % 6}"])
        )
        assert reply.status.code == v2pb.OK, reply

    run_cronjob_now(cluster, "prices-compaction", "prices-compaction-now")

    def compaction() -> dict[str, Any]:
        return dict(
            ((cluster.get("ct", "prices") or {}).get("status") or {}).get("compaction") or {}
        )

    cluster.wait(lambda: compaction().get("result"), 240, "the compaction's result in status")
    result = compaction()
    assert result["result"] == "Succeeded", result
    assert result["recordsRead"] == 60 and result["kept"] == 6 and result["replicasCompacted"] == 2

    run_cronjob_now(cluster, "tables-audit", "tables-audit-now")

    def audit() -> dict[str, Any]:
        return dict(((cluster.get("bg", "tables") or {}).get("status") or {}).get("audit") or {})

    cluster.wait(lambda: audit().get("result"), 240, "the audit's result in status")
    assert audit()["result"] == "Clean", audit()
    assert audit()["recordsChecked"] >= 2 * 6  # both replicas' compacted copies

    # A topic that is no longer compact loses its CronJob.
    cluster.kubectl(
        "patch", "ct", "prices", "--type=merge", "-p", '{"spec":{"cleanupPolicy":"delete"}}'
    )
    cluster.wait(
        lambda: cluster.get("cronjob", "prices-compaction") is None, 60, "the CronJob gone"
    )
