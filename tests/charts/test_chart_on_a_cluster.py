"""`helm install` of the chart on the real control plane (tests/kube/control_plane.py): the
operator's pod, run by the test kubelet with the chart's service account, certificate and
arguments, reconciles the example BrokerGroup and Topic (the namespace's controller and the
brokers come up as pods too), its webhook answers the API server through the chart's
Service, the monitors are made where the Prometheus Operator's CRDs exist, and, the example
resources deleted first (as the chart's README says), `helm uninstall` leaves nothing
running."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.helm import CHART, helm
from tests.charts.test_chart import MONITORING_CRDS
from tests.kube.control_plane import ControlPlane
from tests.kube.kubelet import TestKubelet, running_kubelet
from tests.operator.test_operator_on_a_cluster import condition
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def kubelet(control_plane: ControlPlane, tmp_path: Path) -> Iterator[TestKubelet]:
    with running_kubelet(control_plane.api(), tmp_path) as (running, _):
        yield running


def monitoring_api() -> dict[str, Any]:
    """The Prometheus Operator's kinds, served with an open schema: its CRDs' defaults are
    refused by a 1.20 API server (they validate on 1.21 and later). The operator only asks
    discovery whether the API is served; the objects themselves are checked against the
    real schemas offline (test_chart.py)."""
    items = []
    for path in sorted(MONITORING_CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        open_schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        items.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": crd["metadata"]["name"]},
                "spec": {
                    "group": spec["group"],
                    "names": spec["names"],
                    "scope": spec["scope"],
                    "versions": [
                        {
                            "name": v["name"],
                            "served": v["served"],
                            "storage": v["storage"],
                            "schema": {"openAPIV3Schema": open_schema},
                        }
                        for v in spec["versions"]
                    ],
                },
            }
        )
    return {"apiVersion": "v1", "kind": "List", "items": items}


def get(plane: ControlPlane, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    done = plane.kubectl("-n", namespace, "get", kind, name, "-o", "json")
    return json.loads(done.stdout) if done.returncode == 0 else None


def test_helm_install_runs_the_operator_which_runs_the_example_group(
    control_plane: ControlPlane, kubelet: TestKubelet, tmp_path: Path
) -> None:
    done = control_plane.kubectl("apply", "-f", "-", stdin=json.dumps(monitoring_api()))
    assert done.returncode == 0, done.stderr
    namespace = f"chart-{uuid.uuid4().hex[:8]}"
    assert control_plane.kubectl("create", "namespace", namespace).returncode == 0
    kube = ("--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace)

    def operator_log() -> str:
        logs = sorted((tmp_path / "kubelet" / "pods" / namespace).glob("*-operator-*/*.log"))
        return "\n".join(p.read_text()[-3000:] for p in logs)

    def wait(check: Any, timeout_s: float, what: str) -> None:
        try:
            wait_until(check, timeout_s, what)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n--- kubelet errors: {kubelet.errors[-3:]}\n--- operator:\n"
                + operator_log()
            ) from None

    installed = helm(
        "install", "capstan", str(CHART), *kube,
        "--set", f"operator.watchNamespaces={{{namespace}}}",
        "--set", "examples.enabled=true",
        "--set", "examples.brokerGroup.replicas=2",
        "--set", "examples.brokerGroup.minInSyncReplicas=1",
        "--set", "monitoring.monitors.enabled=true",
        "--wait", "--timeout", "180s",
        scratch=tmp_path, timeout_s=240,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr + operator_log()
    assert f"example.{namespace}.svc:8081" in installed.stdout  # NOTES: how to connect
    assert "monitoring.monitors.enabled=true" not in installed.stdout  # monitors are on

    def example_ready() -> bool:
        return condition(get(control_plane, namespace, "bg", "example"), "Ready") == "True"

    wait(example_ready, 240, "example Ready")
    group = get(control_plane, namespace, "bg", "example")
    assert group is not None and group["status"]["master"] in ("example-0", "example-1")
    wait(
        lambda: (
            ((get(control_plane, namespace, "ct", "example") or {}).get("status") or {}).get(
                "phase"
            )
            == "InSync"
        ),
        60,
        "the example Topic on the brokers",
    )
    # The operator found the Prometheus Operator's API: the group has its ServiceMonitor.
    assert get(control_plane, namespace, "servicemonitor", "example") is not None
    assert get(control_plane, namespace, "servicemonitor", "capstan-operator") is not None
    assert get(control_plane, namespace, "podmonitor", "capstan-controllers") is not None

    # The webhook, called by the API server through the chart's Service, refuses by name.
    bad = {
        "apiVersion": "capstan.io/v1alpha1",
        "kind": "BrokerGroup",
        "metadata": {"name": "bad"},
        "spec": {"replicas": 1, "minInSyncReplicas": 2, "storage": {"size": "1Gi"}},
    }

    def refused() -> bool:
        done = control_plane.kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps(bad))
        if done.returncode == 0:
            control_plane.kubectl("-n", namespace, "delete", "bg", "bad", "--wait=false")
            return False
        return "spec.minInSyncReplicas: minInSyncReplicas must not exceed replicas" in (done.stderr)

    wait(refused, 60, "the webhook to refuse a BrokerGroup by name")
    hooks = control_plane.kubectl(
        "get", "validatingwebhookconfiguration", "capstan.capstan.io", "-ojson"
    )  # fmt: skip
    for hook in json.loads(hooks.stdout)["webhooks"]:
        assert hook["clientConfig"]["service"]["name"] == "capstan-webhook"
        assert "url" not in hook["clientConfig"]

    # As the chart's README says: the resources go first, while the operator runs them.
    done = control_plane.kubectl(
        "-n", namespace, "delete", "topics.capstan.io/example",
        "brokergroups.capstan.io/example", "--wait", "--timeout=120s",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    uninstall = ("uninstall", "capstan", *kube, "--wait", "--timeout", "120s")
    removed = helm(*uninstall, scratch=tmp_path, timeout_s=180)
    assert removed.returncode == 0, removed.stderr
    wait(
        lambda: (
            all(
                get(control_plane, namespace, kind, name) is None
                for kind, name in [
                    ("deployment", "capstan-operator"),
                    ("bg", "example"),
                    ("ct", "example"),
                    ("statefulset", "example"),
                ]
            )
            and not any(
                control_plane.kubectl(
                    "get", kind, "capstan.capstan.io", "--ignore-not-found"
                ).stdout
                for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration")
            )
        ),
        120,
        "the release, its webhook configurations and what the operator made for it gone",
    )
