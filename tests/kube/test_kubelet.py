"""The test kubelet runs a real StatefulSet's pods: each gets its own loopback Pod IP and a
stable DNS name, its claim's data outlives the pod, probes decide readiness, and a deleted
pod gets SIGTERM and is created again by the real StatefulSet controller."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.kube.kubelet import TestKubelet, running_kubelet
from tests.waiting import wait_until

NAMESPACE = f"kubelet-{uuid.uuid4().hex[:8]}"

STATEFUL_SET: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "StatefulSet",
    "metadata": {"name": "web"},
    "spec": {
        "serviceName": "web",
        "replicas": 2,
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {
                "terminationGracePeriodSeconds": 5,
                "containers": [
                    {
                        "name": "web",
                        "image": "python:3.11",
                        "command": ["sh", "-c"],
                        "args": [
                            "cat /etc/site/greeting >> /data/starts && cd /data && "
                            "exec python3 -m http.server 8000 --bind $(POD_IP)"
                        ],
                        "env": [
                            {
                                "name": "POD_IP",
                                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                            }
                        ],
                        "readinessProbe": {
                            "httpGet": {"path": "/starts", "port": 8000},
                            "periodSeconds": 1,
                        },
                        "volumeMounts": [
                            {"name": "data", "mountPath": "/data"},
                            {"name": "site", "mountPath": "/etc/site"},
                        ],
                    }
                ],
                "volumes": [{"name": "site", "configMap": {"name": "site"}}],
            },
        },
        "volumeClaimTemplates": [
            {
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Mi"}},
                },
            }
        ],
    },
}


@pytest.fixture
def kubelet(
    control_plane: Any, tmp_path: Path
) -> Iterator[tuple[client.ApiClient, TestKubelet, list[str]]]:
    api = control_plane.api()
    with running_kubelet(api, tmp_path) as (node, enter):
        yield api, node, enter
    assert node.errors == []


def ready_pods(core: client.CoreV1Api) -> dict[str, str]:
    pods = core.list_namespaced_pod(NAMESPACE).items
    return {
        p.metadata.name: p.status.pod_ip
        for p in pods
        if p.metadata.deletion_timestamp is None
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())
    }


def test_a_stateful_set_runs_with_stable_names_and_lasting_claims(kubelet) -> None:
    api, _, enter = kubelet
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    core.create_namespaced_config_map(
        NAMESPACE, {"metadata": {"name": "site"}, "data": {"greeting": "hello\n"}}
    )
    core.create_namespaced_service(
        NAMESPACE,
        {
            "metadata": {"name": "web"},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "web"},
                "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
            },
        },
    )
    apps.create_namespaced_stateful_set(NAMESPACE, STATEFUL_SET)
    wait_until(lambda: len(ready_pods(core)) == 2, 60, "both pods ready")
    ips = ready_pods(core)
    assert len(set(ips.values())) == 2 and all(ip.startswith("198.18.0.") for ip in ips.values())

    def endpoints() -> set[str]:
        found = core.read_namespaced_endpoints("web", NAMESPACE)
        return {a.ip for subset in found.subsets or () for a in subset.addresses or ()}

    # The real endpoints controller takes the pods' addresses (it refuses loopback ones).
    wait_until(lambda: endpoints() == set(ips.values()), 30, "the Service's endpoints")
    fetch = [
        *enter,
        sys.executable,
        "-c",
        "import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=5).read().decode())",
    ]
    served = subprocess.run(
        [*fetch, f"http://web-0.web.{NAMESPACE}.svc:8000/starts"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert served.stdout == "hello\n\n", served.stderr

    first_uid = core.read_namespaced_pod("web-0", NAMESPACE).metadata.uid
    core.delete_namespaced_pod("web-0", NAMESPACE)
    wait_until(
        lambda: (
            "web-0" in ready_pods(core)
            and core.read_namespaced_pod("web-0", NAMESPACE).metadata.uid != first_uid
        ),
        60,
        "web-0 created again and ready",
    )
    ip = ready_pods(core)["web-0"]
    with urllib.request.urlopen(f"http://{ip}:8000/starts", timeout=5) as reply:
        assert reply.read().decode() == "hello\nhello\n"  # the claim outlived the pod
