"""Step i's Prometheus: the real one (Debian's, scripts/chart_tools.sh) as a process on this
machine, scraping Capstan's pods every second and evaluating the chart's alerts as `helm
template` renders them. It needs the pods' addresses routable from here, as they are on the
local node.

Debian builds Prometheus without its Kubernetes discovery (`kubernetes_sd_configs` is an
unknown field there), so `PodTargets` stands in for it: a thread that lists the pods through
the API server every second and keeps a `file_sd_configs` file of the pods the chart README's
kubernetes_sd config selects (labelled `app.kubernetes.io/part-of=capstan`, running, with a
container port named `metrics`), labelled as that config's relabelling does (`component`,
`namespace`, `pod`)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client
from tests.charts.test_chart import MONITORING_CRDS

SCRAPE_S = 1
PART_OF = "app.kubernetes.io/part-of=capstan"


def pod_targets(pods: list[Any]) -> list[dict[str, Any]]:
    """file_sd entries for the pods (kubernetes client models) the chart's config scrapes."""
    entries = []
    for pod in pods:
        if pod.status.phase != "Running" or not pod.status.pod_ip:
            continue
        labels = pod.metadata.labels or {}
        for container in pod.spec.containers:
            for port in container.ports or []:
                if port.name != "metrics":
                    continue
                entries.append(
                    {
                        "targets": [f"{pod.status.pod_ip}:{port.container_port}"],
                        "labels": {
                            "component": labels.get("app.kubernetes.io/component", ""),
                            "namespace": pod.metadata.namespace,
                            "pod": pod.metadata.name,
                        },
                    }
                )
    return sorted(entries, key=lambda e: e["targets"][0])


class PodTargets:
    """Keeps `path` (a file_sd file) equal to `pod_targets` of the cluster's pods, every
    second, until stopped; a failed list keeps the last file (and is counted)."""

    def __init__(self, core: client.CoreV1Api, path: Path) -> None:
        self.core, self.path = core, path
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-targets", daemon=True)

    def start(self) -> PodTargets:
        self.refresh()
        self._thread.start()
        return self

    def refresh(self) -> None:
        pods = self.core.list_pod_for_all_namespaces(label_selector=PART_OF, _request_timeout=10)
        text = json.dumps(pod_targets(pods.items), indent=1)
        if not self.path.exists() or self.path.read_text() != text:
            part = self.path.with_suffix(".part")
            part.write_text(text)
            part.rename(self.path)  # whole, for Prometheus's file watch

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_S):
            try:
                self.refresh()
            except (client.ApiException, urllib3.exceptions.HTTPError, OSError):  # next round
                self.failures += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)


def prometheus_config(targets: Path, rule_file: Path) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "rule_files": [str(rule_file)],
        "scrape_configs": [
            {
                "job_name": "capstan",
                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
            }
        ],
    }


def prometheus_operator_api() -> dict[str, Any]:
    """The Prometheus Operator's kinds (ServiceMonitor, PodMonitor, PrometheusRule), served
    with an open schema: a 1.20 API server refuses their CRDs' defaults (they are valid from
    1.21 on). The operator and the chart only ask discovery whether the API is served; the
    objects themselves are checked against the real schemas offline (tests/charts)."""
    items = []
    for path in sorted(MONITORING_CRDS.glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())["spec"]
        open_schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        items.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{spec['names']['plural']}.{spec['group']}"},
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
