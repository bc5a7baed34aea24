"""The operator's own status writes (operator/status_writer.py) on the real API server: what
a handler fills is merged into the object's status, a group without a master loses its
`master` (the 1.20 server here refuses an empty string in a merge patch), and a refused
write is a temporary error naming the server's message."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import kopf
import pytest

from capstan.operator.kube_objects import KubeObjects
from capstan.operator.status_writer import own_status, without_empty_strings
from tests.kube.control_plane import ControlPlane
from tests.operator.test_crds_on_api_server import apply_crds, new_namespace


def test_empty_strings_are_left_out_as_nulls_and_missing_keys_of_list_items() -> None:
    status = {
        "master": "",
        "epoch": 3,
        "rollout": "",
        "replicas": [{"pod": "g-0", "note": ""}],
        "audit": {"result": "", "kept": 0},
    }
    assert without_empty_strings(status) == {
        "master": None,
        "epoch": 3,
        "rollout": None,
        "replicas": [{"pod": "g-0"}],
        "audit": {"result": None, "kept": 0},
    }


def _group(plane: ControlPlane, namespace: str) -> dict[str, Any]:
    got = plane.kubectl("get", "bg", "g", "-n", namespace, "-o", "json")
    assert got.returncode == 0, got.stderr
    found: dict[str, Any] = json.loads(got.stdout)
    return found


@pytest.mark.slow
def test_a_status_written_with_and_then_without_a_master(control_plane: ControlPlane) -> None:
    apply_crds(control_plane)
    ns = new_namespace(control_plane)
    group = {
        "apiVersion": "capstan.io/v1alpha1",
        "kind": "BrokerGroup",
        "metadata": {"name": "g", "namespace": ns},
        "spec": {"replicas": 2, "minInSyncReplicas": 1, "storage": {"size": "1Gi"}},
    }
    made = control_plane.kubectl("apply", "-f", "-", stdin=json.dumps(group))
    assert made.returncode == 0, made.stderr
    kube = KubeObjects(control_plane.api())

    async def write(status: dict[str, Any]) -> None:
        async with own_status(kube, "brokergroups", group) as patch:
            patch.status.update(status)

    asyncio.run(write({"master": "g-0", "epoch": 1, "ready": "2/2"}))
    assert _group(control_plane, ns)["status"] == {"master": "g-0", "epoch": 1, "ready": "2/2"}
    asyncio.run(write({"master": "", "epoch": 1, "ready": "1/2"}))
    assert _group(control_plane, ns)["status"] == {"epoch": 1, "ready": "1/2"}
    with pytest.raises(kopf.TemporaryError, match=r"HTTP 422: .*status\.epoch"):
        asyncio.run(write({"epoch": "not a number"}))
    assert _group(control_plane, ns)["status"] == {"epoch": 1, "ready": "1/2"}
