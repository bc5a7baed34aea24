"""spec.rack: a group's pods go only to nodes with the zone label, spread at most one apart
over the zones, beside the user's own node terms and spread constraints; each broker reads
its zone from a file of its pod's capstan.io/zone annotation, which the operator sets from
the pod's node once the pod is scheduled (operator/rack.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest
import yaml

from capstan.operator import rack, resource_rules
from capstan.operator.manifests import names
from tests.operator.test_crds import schema_errors
from tests.operator.test_manifests import body, built

ZONE = "topology.kubernetes.io/zone"


def pod_spec(**spec: Any) -> dict[str, Any]:
    template: dict[str, Any] = built({"replicas": 3, **spec}).stateful_set()["spec"]["template"]
    return template


def test_a_rack_spreads_the_pods_over_zones_and_mounts_the_zone_file() -> None:
    plain = pod_spec()["spec"]
    pod = pod_spec(rack={"topologyKey": ZONE})["spec"]
    selector = names.selector_labels(body()["metadata"]["name"], "broker")
    assert pod["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": selector},
        }
    ]
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required == {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": ZONE, "operator": "Exists"}]}]
    }
    assert pod["affinity"]["podAntiAffinity"] == plain["affinity"]["podAntiAffinity"]
    (container,) = pod["containers"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "rack"]
    (item,) = volume["downwardAPI"]["items"]
    assert item == {
        "path": "zone",
        "fieldRef": {"fieldPath": "metadata.annotations['capstan.io/zone']"},
    }
    assert {"name": "rack", "mountPath": names.RACK_DIR, "readOnly": True} in container[
        "volumeMounts"
    ]
    assert container["args"][-2:] == ["--set", f"zone_file={names.RACK_DIR}/zone"]
    assert "rack" not in [v["name"] for v in plain["volumes"]]
    sts = built({"replicas": 3, "rack": {"topologyKey": ZONE}}).stateful_set()
    kubernetes_validate.validate(yaml.safe_load(yaml.safe_dump(sts)), "1.30.0", strict=True)


def test_the_users_node_terms_and_spread_constraints_stay_beside_the_racks() -> None:
    theirs = {"key": "node-role.example.com/mq", "operator": "In", "values": ["true"]}
    other = {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
    spread = {
        "maxSkew": 2,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"team": "payments"}},
    }
    template = {
        "pod": {
            "topologySpreadConstraints": [spread],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [theirs]},
                            {"matchExpressions": [other]},
                        ]
                    }
                }
            },
        }
    }
    pod = pod_spec(rack={"topologyKey": ZONE}, template=template)["spec"]
    assert pod["topologySpreadConstraints"][0] == spread
    assert pod["topologySpreadConstraints"][1]["topologyKey"] == ZONE
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    labelled = {"key": ZONE, "operator": "Exists"}
    # Either of the user's alternatives, each on a node that has a zone.
    assert terms == [
        {"matchExpressions": [theirs, labelled]},
        {"matchExpressions": [other, labelled]},
    ]
    # The user's template itself is left as it was (a later build starts from it again).
    assert template["pod"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0] == {"matchExpressions": [theirs]}


def test_adding_a_rack_rolls_the_pods() -> None:
    assert pod_spec(rack={"topologyKey": ZONE}) != pod_spec()


@pytest.mark.parametrize(
    "key", ["", "Zone/x", "-zone", "a/b/c", "topology.kubernetes.io/", "x" * 64]
)
def test_the_schema_refuses_a_topology_key_that_is_no_label_key(key: str) -> None:
    errors = schema_errors("BrokerGroup", body({"replicas": 3, "rack": {"topologyKey": key}}))
    assert {e.split(":")[0] for e in errors} == {"spec.rack.topologyKey"}, errors


@pytest.mark.parametrize(
    "key", [ZONE, "zone", "example.com/rack_1", "failure-domain.beta.kubernetes.io/zone"]
)
def test_the_schema_takes_a_label_key(key: str) -> None:
    good = body({"replicas": 3, "rack": {"topologyKey": key}})
    assert schema_errors("BrokerGroup", good) == []
    assert schema_errors("BrokerGroup", body({"replicas": 3, "rack": {}})) != []


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"brokerConfig": {"zone": "a"}}, "spec.brokerConfig.zone"),
        ({"brokerConfig": {"zone_file": "/tmp/z"}}, "spec.brokerConfig.zone_file"),
        (
            {"template": {"pod": {"metadata": {"annotations": {"capstan.io/zone": "a"}}}}},
            "spec.template.pod.metadata.annotations.capstan.io/zone",
        ),
    ],
)
def test_the_zone_is_the_operators_to_set(spec: dict[str, Any], field: str) -> None:
    errors = resource_rules.broker_group_errors({"replicas": 3, **spec})
    assert [e.field for e in errors] == [field]


def pod(name: str, node: str | None, zone: str | None = None) -> Any:
    annotations = {names.ZONE_ANNOTATION: zone} if zone else {}
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name, annotations=annotations),
        spec=SimpleNamespace(node_name=node),
    )


def test_each_scheduled_pod_without_a_zone_gets_its_nodes_and_each_node_is_read_once() -> None:
    nodes = {"n1": {ZONE: "zone-a"}, "n2": {ZONE: "zone-b"}, "bare": {}}
    reads: list[str] = []

    async def labels(node: str) -> dict[str, str] | None:
        reads.append(node)
        return nodes.get(node)

    pods = [
        pod("g-0", "n1"),
        pod("g-1", "n2"),
        pod("g-2", "n1"),
        pod("g-3", None),  # not scheduled yet
        pod("g-4", "n2", zone="zone-b"),  # told already
        pod("g-5", "bare"),  # a node without the label: no zone to tell
        pod("g-6", "gone"),  # a node deleted meanwhile
    ]
    wanted = asyncio.run(rack.zones_to_set(pods, ZONE, labels))
    assert wanted == {"g-0": "zone-a", "g-1": "zone-b", "g-2": "zone-a"}
    assert sorted(reads) == ["bare", "gone", "n1", "n2"]
