"""The chart's dashboards and alerts against a real Prometheus scraping live Capstan
processes: `capstan up` (a controller and a master+slave group) under a short load with the
official clients (sends, receives, a message dead-lettered) and a master kill -9, plus
`capstan operator` on the real control plane reconciling resources, one of which keeps
failing, and an offset audit pushing to a real Pushgateway that Prometheus scrapes. Every
query of every dashboard panel returns data, the HA panels show the epoch change,
Prometheus evaluates every alert rule without error, and every metric an alert reads is
served. The scrape config used is `prometheus.scrape_config` (the chart's README has the
Kubernetes one)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

from capstan.client.consumer.push_consumer import PushConsumer
from capstan.client.consumer.settings import ConsumeStatus
from tests.broker.broker_process import free_port
from tests.charts.prometheus import (
    Prometheus,
    metrics_of_alerts_not_served,
    panels_without_data,
    rules_not_evaluated,
    scrape_config,
)
from tests.charts.pushgateway import running_pushgateway
from tests.charts.test_alerts import rendered_rules
from tests.cli.test_broker_cli import capstan
from tests.cli.test_up import group_status
from tests.cli.up_process import UpProcess
from tests.kube.control_plane import ControlPlane
from tests.operator.test_crds_on_api_server import apply_crds
from tests.waiting import wait_until

# Spark drivers start as processes of their own here (a JVM each: 18 s alone on the 2-core
# machine); in CI, beside the e2e story's cold image builds, one of these took over 300 s,
# the default per-test bound, hence 900 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def operator_metrics(control_plane: ControlPlane, tmp_path: Path) -> Iterator[str]:
    """`capstan operator` on the real control plane, reconciling a BrokerGroup that never
    runs (no kubelet here) and a ConsumerGroup on it that therefore keeps failing; its
    metrics address."""
    apply_crds(control_plane)
    namespace = f"mon-{uuid.uuid4().hex[:8]}"
    assert control_plane.kubectl("create", "namespace", namespace).returncode == 0
    port = free_port()
    with (tmp_path / "operator.log").open("wb") as log:
        operator = subprocess.Popen(
            [
                *(sys.executable, "-m", "capstan.cli", "operator", "--namespace", namespace),
                *("--kubeconfig", str(control_plane.kubeconfig), "--listen-host", "127.0.0.1"),
                *("--liveness-port", str(free_port()), "--metrics-port", str(port)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONSAFEPATH": "1"},
        )
    resources = [
        {
            "apiVersion": "capstan.io/v1alpha1",
            "kind": "BrokerGroup",
            "metadata": {"name": "orders"},
            "spec": {"replicas": 1, "minInSyncReplicas": 1, "storage": {"size": "1Gi"}},
        },
        {
            "apiVersion": "capstan.io/v1alpha1",
            "kind": "ConsumerGroup",
            "metadata": {"name": "billing"},
            "spec": {"groupName": "Billing", "brokerGroups": ["orders"]},
        },
    ]
    for resource in resources:
        done = control_plane.kubectl(
            "-n", namespace, "apply", "-f", "-", stdin=json.dumps(resource)
        )
        assert done.returncode == 0, done.stderr
    try:
        yield f"127.0.0.1:{port}"
    finally:
        operator.terminate()
        operator.wait(30)
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false")


@pytest.fixture
def pushgateway() -> Iterator[str]:
    with running_pushgateway() as address:
        yield address


def test_every_dashboard_panel_and_alert_reads_live_data(
    tmp_path: Path, operator_metrics: str, pushgateway: str
) -> None:
    up = UpProcess(tmp_path / "up").start()
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rendered_rules(tmp_path), sort_keys=False))
    jobs = {
        "broker": [f"127.0.0.1:{up.http_port}", f"127.0.0.1:{up.http_port + 1}"],
        "controller": [f"127.0.0.1:{up.http_port + 2}"],
        "operator": [operator_metrics],
        "pushgateway": [pushgateway],  # where the offset audit's figures arrive
    }
    prometheus = Prometheus(tmp_path / "prometheus", scrape_config(jobs, rules)).start()
    try:
        server = ("--server", up.access_point)
        assert capstan("topic", "create", "Orders", *server).returncode == 0
        made = capstan("group", "create", "Billing", "--max-attempts", "1", *server)
        assert made.returncode == 0, made.stderr
        config = ClientConfiguration(up.access_point, Credentials(), request_timeout=5)
        producer = Producer(config, ("Orders",))
        producer.startup()
        consumer = SimpleConsumer(config, "Billing", {"Orders": FilterExpression("*")}, 2)
        consumer.startup()
        members: list[PushConsumer] = []
        try:
            first_epoch = epoch(up)
            send(producer, 100)
            # Received and never acknowledged: with one attempt allowed, a dead letter.
            got = consumer.receive(1, 10)  # invisible for 10 s, the least a broker allows
            assert got
            wait_until(
                lambda: bool(prometheus.query("sum(rocketmq_send_to_dlq_messages_total) > 0")),
                60,
                "a dead letter on /metrics",
            )
            for m in consumer.receive(32, 10):
                consumer.ack(m)

            master = next(r for r in group_status(up)["replicas"] if r["role"] == "master")
            os.kill(master["pid"], signal.SIGKILL)
            wait_until(lambda: epoch(up) > first_epoch, 30, "a new master")
            send(producer, 50)  # the client finds the new master
            for m in consumer.receive(32, 10):
                consumer.ack(m)
            wait_until(
                lambda: bool(prometheus.query("changes(capstan_controller_master_epoch[5m]) > 0")),
                30,
                "the epoch change in Prometheus",
            )
            # Capstan's SDK consumer joins its group by heartbeats and rebalances: members.
            assert capstan("group", "create", "Audit", *server).returncode == 0
            audit = PushConsumer(
                up.access_point, "Audit", lambda messages, context: ConsumeStatus.CONSUME_SUCCESS
            )
            audit.subscribe("Orders")
            audit.start()
            members.append(audit)
            wait_until(
                lambda: bool(prometheus.query("capstan_consumer_group_members > 0")),
                30,
                "the SDK consumer a member of its group",
            )
            wait_until(
                lambda: bool(prometheus.query("capstan_operator_reconcile_errors_total")),
                60,
                "the operator's failing reconciles in Prometheus",
            )
            # The offset audit pushes its figures; Prometheus scrapes them from the gateway.
            audited = subprocess.run(
                [sys.executable, "-m", "capstan.cli", "spark", "audit", "--server",
                 up.access_point, "--master", "local[2]", "--pushgateway", pushgateway],
                capture_output=True, text=True, timeout=300,
                env={**os.environ, "PYTHONSAFEPATH": "1", "TMPDIR": str(tmp_path)},
            )  # fmt: skip
            assert audited.returncode in (0, 1), audited.stderr[-3000:]  # 1: it found problems
            wait_until(
                lambda: bool(prometheus.query("capstan_audit_last_run_timestamp_seconds")),
                30,
                "the audit's figures in Prometheus",
            )
            time.sleep(3)  # a few more scrapes of everything

            empty = panels_without_data(prometheus)
            assert empty == [], "panels with no data:\n" + "\n".join(empty)
            # The HA dashboard shows the failover: the epoch stepped up.
            (step,) = prometheus.query("max(changes(capstan_controller_master_epoch[5m]))")
            assert float(step["value"][1]) >= 1

            assert rules_not_evaluated(prometheus, rules) == []
            assert metrics_of_alerts_not_served(prometheus, rules) == []
        finally:
            for member in members:
                member.shutdown()
            consumer.shutdown()
            producer.shutdown()
    finally:
        prometheus.stop()
        assert up.stop() == 0


def send(producer: Producer, count: int, timeout_s: float = 30) -> None:
    """Send `count` messages, each again until accepted (across a failover, the client's
    own retries can run out before the slave learns its new role)."""
    deadline = time.monotonic() + timeout_s
    for i in range(count):
        m = Message()
        m.topic = "Orders"
        m.body = f"order-{i}".encode()
        while True:
            try:
                producer.send(m)
                break
            except Exception:  # the client raises its own error types
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def epoch(up: UpProcess) -> int:
    return int(group_status(up)["epoch"])
