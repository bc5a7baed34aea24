"""The CRDs on a real API server (1.20): `kubectl apply -f crds/` establishes them, the
examples are accepted and defaulted by the server, the schemas refuse a bad field, and
`kubectl get bg` prints the columns of the CRD."""

from __future__ import annotations

import json
import uuid

from tests.kube.control_plane import ControlPlane
from tests.operator.test_crds import CRD_DIR


def apply_crds(plane: ControlPlane) -> None:
    # 1.20 does not know CEL rules (1.25+): kubectl would refuse the unknown key before
    # sending; the server itself drops it, and the webhook enforces the rules instead.
    done = plane.kubectl("apply", "--validate=false", "-f", str(CRD_DIR))
    assert done.returncode == 0, done.stderr
    for plural in ("brokergroups", "topics", "consumergroups"):
        done = plane.kubectl(
            "wait", "--for=condition=Established", f"crd/{plural}.capstan.io", "--timeout=30s"
        )
        assert done.returncode == 0, done.stderr


def new_namespace(plane: ControlPlane) -> str:
    name = f"crd-{uuid.uuid4().hex[:8]}"
    assert plane.kubectl("create", "namespace", name).returncode == 0
    return name


def test_the_examples_are_accepted_defaulted_and_listed_with_their_columns(
    control_plane: ControlPlane,
) -> None:
    apply_crds(control_plane)
    ns = new_namespace(control_plane)
    done = control_plane.kubectl("apply", "-n", ns, "-f", str(CRD_DIR / "examples"))
    assert done.returncode == 0, done.stderr
    got = control_plane.kubectl("get", "bg", "broker-a", "-n", ns, "-o", "json")
    spec = json.loads(got.stdout)["spec"]
    assert spec["replicas"] == 3
    # No image of its own: the group runs the operator's (operator/image_default.py).
    assert "image" not in spec and spec["antiAffinity"] == "preferred"
    assert spec["storage"] == {"size": "20Gi", "deleteClaim": False}
    assert spec["terminationGracePeriodSeconds"] == 30
    assert spec["brokerConfig"] == {"store": {"file_reserved_hours": 48}}
    topic = json.loads(control_plane.kubectl("get", "ct", "orders", "-n", ns, "-o", "json").stdout)
    assert topic["spec"]["readable"] is True and topic["spec"]["cleanupPolicy"] == "delete"
    group = json.loads(control_plane.kubectl("get", "cg", "billing", "-n", ns, "-o", "json").stdout)
    assert group["spec"]["fifo"] is False and group["spec"]["retry"] == {"maxAttempts": 5}
    user = json.loads(
        control_plane.kubectl("get", "cu", "billing-app", "-n", ns, "-o", "json").stdout
    )
    assert user["spec"]["userType"] == "Normal" and user["spec"]["enabled"] is True
    assert user["spec"]["acl"][0]["decision"] == "Allow"  # defaulted per entry
    listed = control_plane.kubectl("get", "bg", "-n", ns)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["NAME", "READY", "MASTER", "EPOCH", "IN-SYNC", "AGE"]
    assert row.split()[0] == "broker-a"
    wide = control_plane.kubectl("get", "capstan", "-n", ns, "-o", "name")
    assert set(wide.stdout.split()) == {
        "brokergroup.capstan.io/broker-a",
        "topic.capstan.io/orders",
        "consumergroup.capstan.io/billing",
        "capstanuser.capstan.io/billing-app",
    }


def test_the_server_refuses_a_field_outside_the_schema_by_name(
    control_plane: ControlPlane,
) -> None:
    apply_crds(control_plane)
    ns = new_namespace(control_plane)
    bad = {
        "apiVersion": "capstan.io/v1alpha1",
        "kind": "BrokerGroup",
        "metadata": {"name": "zero"},
        "spec": {"replicas": 0, "antiAffinity": "sometimes"},
    }
    done = control_plane.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(bad))
    assert done.returncode != 0
    assert "spec.replicas" in done.stderr and "spec.antiAffinity" in done.stderr
