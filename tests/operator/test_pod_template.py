"""A BrokerGroup's spec.template and the controller's template reach the pods they build:
scheduling settings as given, the operator's own labels, variables and restrictions kept,
and whatever would take them away refused by name."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
import yaml

from capstan.operator import resource_rules
from capstan.operator.manifests import names
from capstan.operator.manifests.broker_group import CONTROLLER_COMPONENT
from capstan.operator.manifests.controller import ControllerManifests
from capstan.operator.manifests.pod_template import USER_ONLY
from tests.operator.test_crds import examples, schema_errors
from tests.operator.test_manifests import NEW, body, built
from tests.operator.test_operator_command import operator

TEMPLATE: dict[str, Any] = {
    "pod": {
        "metadata": {
            "labels": {"team": "payments"},
            "annotations": {"example.com/owner": "payments-oncall"},
        },
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "mq", "effect": "NoSchedule"}
        ],
        "nodeSelector": {"node-role.example.com/mq": "true"},
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"team": "payments"}},
            }
        ],
        "priorityClassName": "mq-critical",
        "imagePullSecrets": [{"name": "registry-key"}],
        "securityContext": {"supplementalGroups": [4000]},
    },
    "container": {
        "securityContext": {"readOnlyRootFilesystem": True},
        "env": [{"name": "TZ", "value": "UTC"}],
    },
}


def pod_of(spec_template: dict[str, Any] | None, **spec: Any) -> dict[str, Any]:
    group = {"replicas": 3, **spec}
    if spec_template is not None:
        group["template"] = spec_template
    pod: dict[str, Any] = built(group).stateful_set()["spec"]["template"]
    return pod


def test_a_groups_template_reaches_its_pods_beside_what_the_operator_sets() -> None:
    plain = pod_of(None)
    pod = pod_of(TEMPLATE)
    spec, (container,) = pod["spec"], pod["spec"]["containers"]
    user = TEMPLATE["pod"]
    for key in USER_ONLY:
        assert spec[key] == user[key]
        assert key not in plain["spec"]
    # Added, never instead of the operator's own: the selector and the config hash stay.
    assert pod["metadata"]["labels"] == {**plain["metadata"]["labels"], "team": "payments"}
    assert pod["metadata"]["annotations"] == {
        **plain["metadata"]["annotations"],
        "example.com/owner": "payments-oncall",
    }
    # Security contexts: the user's keys over the operator's restricted ones.
    assert spec["securityContext"] == {
        **plain["spec"]["securityContext"],
        "supplementalGroups": [4000],
    }
    (plain_container,) = plain["spec"]["containers"]
    assert container["securityContext"] == {
        **plain_container["securityContext"],
        "readOnlyRootFilesystem": True,
    }
    assert container["env"] == [*plain_container["env"], {"name": "TZ", "value": "UTC"}]
    # The hostname anti-affinity of spec.antiAffinity stays: the template names none.
    assert spec["affinity"] == plain["spec"]["affinity"]


def test_the_template_is_a_valid_pod_for_the_api_server() -> None:
    sts = built({"replicas": 3, "template": TEMPLATE}).stateful_set()
    controller = ControllerManifests("shop", [], NEW, template=TEMPLATE).stateful_set()
    for obj in (sts, controller):
        kubernetes_validate.validate(yaml.safe_load(yaml.safe_dump(obj)), "1.30.0", strict=True)


def test_each_affinity_kind_given_replaces_the_operators_and_only_that_kind() -> None:
    zones = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": "topology.kubernetes.io/zone",
                            "operator": "In",
                            "values": ["a", "b"],
                        }
                    ]
                }
            ]
        }
    }
    own = pod_of(None, antiAffinity="required")["spec"]["affinity"]["podAntiAffinity"]
    nodes = pod_of({"pod": {"affinity": {"nodeAffinity": zones}}}, antiAffinity="required")
    assert nodes["spec"]["affinity"] == {"nodeAffinity": zones, "podAntiAffinity": own}
    theirs = {"preferredDuringSchedulingIgnoredDuringExecution": []}
    replaced = pod_of({"pod": {"affinity": {"podAntiAffinity": theirs}}}, antiAffinity="required")
    assert replaced["spec"]["affinity"] == {"podAntiAffinity": theirs}


def test_container_resources_come_from_the_template_or_spec_resources_not_both() -> None:
    wanted = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    pod = pod_of({"container": {"resources": wanted}})
    assert pod["spec"]["containers"][0]["resources"] == wanted
    errors = resource_rules.broker_group_errors(
        {"replicas": 1, "resources": wanted, "template": {"container": {"resources": wanted}}}
    )
    assert [e.field for e in errors] == ["spec.template.container.resources"]
    assert "set them in one place" in errors[0].message


@pytest.mark.parametrize(
    ("template", "field", "said"),
    [
        (
            {"pod": {"metadata": {"labels": {"app.kubernetes.io/instance": "other"}}}},
            "spec.template.pod.metadata.labels.app.kubernetes.io/instance",
            "is set by the operator; leave it out",
        ),
        (
            {"pod": {"metadata": {"annotations": {names.CONFIG_HASH_ANNOTATION: "x"}}}},
            f"spec.template.pod.metadata.annotations.{names.CONFIG_HASH_ANNOTATION}",
            "is set by the operator; leave it out",
        ),
        (
            {"container": {"env": [{"name": "POD_IP", "value": "1.2.3.4"}]}},
            "spec.template.container.env[0]",
            "POD_IP is set by the operator; leave it out",
        ),
        (
            {"pod": {"hostNetwork": True}},
            "spec.template.pod",
            "unknown fields hostNetwork",
        ),
        (
            {"pod": {"affinity": {"zoneAffinity": {}}}},
            "spec.template.pod.affinity",
            "unknown kinds zoneAffinity",
        ),
        ({"pod": {"tolerations": {"key": "x"}}}, "spec.template.pod.tolerations", "must be a list"),
        (
            {"pod": {"imagePullSecrets": [{"secret": "x"}]}},
            "spec.template.pod.imagePullSecrets[0]",
            "must be {name: <a Secret>}",
        ),
    ],
)
def test_a_template_that_would_take_the_operators_parts_or_is_malformed_is_refused(
    template: dict[str, Any], field: str, said: str
) -> None:
    errors = resource_rules.broker_group_errors({"replicas": 1, "template": template})
    assert [e.field for e in errors] == [field]
    assert errors[0].message.startswith(said)


def test_the_crd_schema_takes_the_template_and_refuses_a_wrong_type() -> None:
    good = body({"replicas": 3, "template": TEMPLATE})
    assert schema_errors("BrokerGroup", good) == []
    assert resource_rules.broker_group_errors(good["spec"]) == []
    bad = body({"replicas": 3, "template": {"pod": {"nodeSelector": {"zone": 1}}}})
    assert [e.split(":")[0] for e in schema_errors("BrokerGroup", bad)] == [
        "spec.template.pod.nodeSelector.zone"
    ]
    assert examples()["BrokerGroup"]["spec"].get("template") is None


def test_a_template_change_rolls_the_pods_as_a_config_change_does() -> None:
    """The pod template changes, so the StatefulSet's revision does and the roller replaces
    the pods one at a time; a template with nothing in it changes nothing."""
    before = pod_of(None)
    assert pod_of({}) == before
    assert pod_of({"pod": {}, "container": {}}) == before
    assert pod_of({"pod": {"priorityClassName": "high"}}) != before


def test_the_controllers_template_reaches_its_pods() -> None:
    plain = ControllerManifests("shop", [], NEW).stateful_set()["spec"]["template"]
    pod = ControllerManifests("shop", [], NEW, template=TEMPLATE).stateful_set()["spec"]["template"]
    assert pod["spec"]["tolerations"] == TEMPLATE["pod"]["tolerations"]
    assert pod["spec"]["nodeSelector"] == TEMPLATE["pod"]["nodeSelector"]
    assert pod["metadata"]["labels"] == {**plain["metadata"]["labels"], "team": "payments"}
    resources = {"requests": {"cpu": "50m"}}
    sized = ControllerManifests(
        "shop", [], NEW, template={"container": {"resources": resources}}
    ).stateful_set()
    assert sized["spec"]["template"]["spec"]["containers"][0]["resources"] == resources
    errors = resource_rules.pod_template_errors(
        {"pod": {"metadata": {"labels": {"app.kubernetes.io/component": "x"}}}},
        "--controller-template",
        CONTROLLER_COMPONENT,
    )
    assert [e.field for e in errors] == [
        "--controller-template.pod.metadata.labels.app.kubernetes.io/component"
    ]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("{not json", "error: --controller-template is not JSON:"),
        (
            json.dumps({"pod": {"nodeSelecter": {}}}),
            "error: --controller-template.pod: unknown fields nodeSelecter;",
        ),
    ],
)
def test_the_operator_refuses_a_wrong_controller_template_before_it_starts(
    value: str, said: str
) -> None:
    done = operator("--namespace", "capstan", "--controller-template", value)
    assert done.returncode == 2
    assert done.stderr.startswith(said), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
