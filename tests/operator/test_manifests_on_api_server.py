"""The 1.20 API server accepts every object the operator builds for it (server-side dry
run: defaulting, validation and admission, nothing stored)."""

from __future__ import annotations

import json

from capstan.operator.manifests.broker_group import BrokerGroupManifests
from capstan.operator.manifests.cluster import owner_reference
from capstan.operator.manifests.controller import ControllerManifests
from tests.kube.control_plane import ControlPlane
from tests.operator.test_crds import examples
from tests.operator.test_crds_on_api_server import apply_crds, new_namespace
from tests.operator.test_manifests import OLD


def test_the_old_servers_accept_what_is_built_for_them(control_plane: ControlPlane) -> None:
    apply_crds(control_plane)
    ns = new_namespace(control_plane)
    example = examples()["BrokerGroup"]
    done = control_plane.kubectl(
        "create", "-n", ns, "-o", "json", "-f", "-", stdin=json.dumps(example)
    )
    assert done.returncode == 0, done.stderr
    group = json.loads(done.stdout)
    objects = BrokerGroupManifests(group, OLD, secure=True, operator_namespace="op").children()
    owners = [owner_reference(group, controller=False)]
    objects += ControllerManifests(ns, owners, OLD, secure=True, operator_namespace="op").children()
    listed = {"apiVersion": "v1", "kind": "List", "items": objects}
    done = control_plane.kubectl(
        "create", "--dry-run=server", "-o", "name", "-f", "-", stdin=json.dumps(listed)
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == len(objects) == 12  # NetworkPolicies included
