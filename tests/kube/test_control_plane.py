"""The control plane the operator's tests use is real: kubectl talks to it, CRDs are
established and their structural schemas refuse bad fields, and the garbage collector
deletes what a deleted owner owned."""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any

import pytest
from e2e.cluster import Kube
from kubernetes import client

from tests.kube.control_plane import ControlPlane
from tests.kube.node import VERSION
from tests.waiting import wait_until

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.capstan.io"},
    "spec": {
        "group": "test.capstan.io",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"replicas": {"type": "integer", "minimum": 1}},
                            }
                        },
                    }
                },
            }
        ],
    },
}


def kubectl(
    plane: ControlPlane, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return plane.kubectl(*args, stdin=stdin)


def test_kubectl_lists_the_namespaces(control_plane: ControlPlane) -> None:
    done = kubectl(control_plane, "get", "ns", "-o", "name")
    assert done.returncode == 0, done.stderr
    assert {"namespace/default", "namespace/kube-system"} <= set(done.stdout.split())


def test_kubectl_is_the_clusters_own_version(control_plane: ControlPlane) -> None:
    """scripts/k8s_tools.sh builds kubectl 1.20.2 with the server binaries, and the tests and
    the e2e story use it, not whichever kubectl is on PATH (a newer one may send what a 1.20
    API server does not know, and the README's commands are checked with this one)."""
    done = kubectl(control_plane, "version", "-o", "json")
    assert done.returncode == 0, done.stderr
    versions = json.loads(done.stdout)
    assert versions["clientVersion"]["gitVersion"] == f"v{VERSION}"
    assert versions["serverVersion"]["gitVersion"] == f"v{VERSION}"


def test_a_crd_is_established_and_its_schema_refuses_bad_fields(
    control_plane: ControlPlane,
) -> None:
    assert kubectl(control_plane, "apply", "-f", "-", stdin=json.dumps(CRD)).returncode == 0
    done = kubectl(
        control_plane,
        "wait",
        "--for=condition=Established",
        "crd/widgets.test.capstan.io",
        "--timeout=30s",
    )
    assert done.returncode == 0, done.stderr
    bad = {
        "apiVersion": "test.capstan.io/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "namespace": "default"},
        "spec": {"replicas": 0},
    }
    refused = kubectl(control_plane, "apply", "-f", "-", stdin=json.dumps(bad))
    assert refused.returncode != 0
    assert "spec.replicas" in refused.stderr and "greater than or equal to 1" in refused.stderr


def test_the_garbage_collector_deletes_what_a_deleted_owner_owned(
    control_plane: ControlPlane,
) -> None:
    core = client.CoreV1Api(control_plane.api())
    name = f"owner-{uuid.uuid4().hex[:8]}"
    owner = core.create_namespaced_config_map("default", {"metadata": {"name": name}})
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": name,
        "uid": owner.metadata.uid,
    }
    core.create_namespaced_config_map(
        "default", {"metadata": {"name": f"{name}-child", "ownerReferences": [reference]}}
    )
    core.delete_namespaced_config_map(name, "default")

    def child_gone() -> bool:
        try:
            core.read_namespaced_config_map(f"{name}-child", "default")
        except client.ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    wait_until(child_gone, 60, "the garbage collector to delete the child")


def test_a_missing_build_says_how_to_make_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    with pytest.raises(RuntimeError, match=r"run `bash scripts/k8s_tools.sh`"):
        ControlPlane(tmp_path / "plane").start()


def test_the_storys_reads_show_what_kubectl_shows(control_plane: ControlPlane) -> None:
    """The e2e story reads the cluster through the Kubernetes client with kubectl's names
    for kinds (e2e/cluster.py): plural, singular, short and `kind.group` names, a kind only an
    older group version serves, a CRD made after the first read, a label selector, a
    missing object."""
    story = Kube(control_plane.kubeconfig)
    namespace = f"reads-{uuid.uuid4().hex[:8]}"
    assert kubectl(control_plane, "create", "namespace", namespace).returncode == 0
    made = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "labels": {"k": "1"}}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}},
        {
            "apiVersion": "batch/v1beta1",
            "kind": "CronJob",
            "metadata": {"name": "nightly"},
            "spec": {
                "schedule": "0 3 * * *",
                "jobTemplate": {
                    "spec": {
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "containers": [{"name": "c", "image": "local/none"}],
                            }
                        }
                    }
                },
            },
        },
    ]
    for item in made:
        done = kubectl(control_plane, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(item))
        assert done.returncode == 0, done.stderr

    def kubectls(kind: str, *more: str) -> list[dict[str, Any]]:
        done = kubectl(control_plane, "get", kind, "-n", namespace, "-o", "json", *more)
        assert done.returncode == 0, done.stderr
        return list(json.loads(done.stdout)["items"])

    for kind in ("configmaps", "configmap", "cm", "cronjob", "cronjobs.batch", "nodes", "ns"):
        assert story.items(kind, namespace) == kubectls(kind), kind
    assert story.items("cm", namespace, "k=1") == kubectls("cm", "-l", "k=1")
    assert [c["metadata"]["name"] for c in story.items("cm", namespace, "k=1")] == ["a"]
    shown = kubectl(control_plane, "get", "cm", "b", "-n", namespace, "-o", "json").stdout
    assert story.get("configmap", "b", namespace) == json.loads(shown)
    assert story.get("configmap", "nothing-here", namespace) is None
    assert story.get("nosuchkind", "b", namespace) is None

    crd = json.loads(json.dumps(CRD).replace("widget", "gadget").replace("Widget", "Gadget"))
    assert kubectl(control_plane, "apply", "-f", "-", stdin=json.dumps(crd)).returncode == 0
    done = kubectl(
        control_plane, "wait", "--for=condition=Established", "crd/gadgets.test.capstan.io"
    )
    assert done.returncode == 0, done.stderr
    gadget = {"apiVersion": "test.capstan.io/v1", "kind": "Gadget", "metadata": {"name": "g"}}
    done = kubectl(control_plane, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(gadget))
    assert done.returncode == 0, done.stderr
    assert story.items("gadgets.test.capstan.io", namespace) == kubectls("gadgets")
    assert (story.get("gadget", "g", namespace) or {}).get("kind") == "Gadget"
    kubectl(control_plane, "delete", "namespace", namespace, "--wait=false")
