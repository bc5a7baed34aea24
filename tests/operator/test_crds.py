"""The CRDs in crds/: their schemas take the examples and refuse bad fields, every CEL rule
has its twin in operator/resource_rules.py (enforced by the webhook where CEL is not), and
`kubectl get` shows the columns a person looks for."""

from __future__ import annotations

import copy
import pathlib
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import yaml

from capstan.operator import resource_rules

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"
KINDS = ("BrokerGroup", "Topic", "ConsumerGroup", "CapstanUser")


def crds() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        found[crd["spec"]["names"]["kind"]] = crd
    return found


def schema_of(kind: str) -> dict[str, Any]:
    (version,) = crds()[kind]["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def examples() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted((CRD_DIR / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            found[doc["kind"]] = doc
    return found


def schema_errors(kind: str, obj: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema_of(kind))
    return [
        f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in validator.iter_errors(obj)
    ]


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_the_kinds_are_namespaced_capstan_io_v1alpha1_with_status_and_short_names() -> None:
    found = crds()
    assert set(found) == set(KINDS)
    shorts = {}
    for kind, crd in found.items():
        spec = crd["spec"]
        assert crd["metadata"]["name"] == f"{spec['names']['plural']}.capstan.io"
        assert spec["group"] == "capstan.io" and spec["scope"] == "Namespaced"
        (version,) = spec["versions"]
        assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
        assert version["subresources"] == {"status": {}}
        shorts[kind] = spec["names"]["shortNames"]
    assert shorts == {
        "BrokerGroup": ["bg"],
        "Topic": ["ct"],
        "ConsumerGroup": ["cg"],
        "CapstanUser": ["cu"],
    }


@pytest.mark.parametrize("kind", KINDS)
def test_schemas_are_structural_and_every_spec_field_is_described(kind: str) -> None:
    for path, node in walk(schema_of(kind)):
        typed = "type" in node or node.get("x-kubernetes-int-or-string")
        assert typed, f"{kind}{path} has no type (a structural schema needs one)"
        if path.startswith(".spec.") and path.count(".") == 2 and path[-1].isalnum():
            assert node.get("description"), f"{kind}{path} has no description"
    status = schema_of(kind)["properties"]["status"]["properties"]
    assert {"observedGeneration", "conditions"} <= set(status)
    condition = status["conditions"]["items"]
    assert set(condition["required"]) == {
        "type",
        "status",
        "lastTransitionTime",
        "reason",
        "message",
    }


def test_broker_group_printer_columns_are_ready_master_epoch_in_sync_age() -> None:
    (version,) = crds()["BrokerGroup"]["spec"]["versions"]
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"]]
    assert columns == ["READY", "MASTER", "EPOCH", "IN-SYNC", "AGE"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_examples_pass_the_schema_and_the_rules(kind: str) -> None:
    example = examples()[kind]
    assert example["apiVersion"] == "capstan.io/v1alpha1"
    assert schema_errors(kind, example) == []
    assert resource_rules.RULES[kind](example["spec"]) == []


@pytest.mark.parametrize(
    ("kind", "path", "value", "complaint"),
    [
        ("BrokerGroup", ("replicas",), 0, "spec.replicas"),
        ("BrokerGroup", ("replicas",), "three", "spec.replicas"),
        ("BrokerGroup", ("antiAffinity",), "sometimes", "spec.antiAffinity"),
        ("BrokerGroup", ("storage", "size"), "lots", "spec.storage.size"),
        ("BrokerGroup", ("resources", "limits", "memory"), "2 gigs", "spec.resources.limits"),
        ("Topic", ("messageType",), "URGENT", "spec.messageType"),
        ("Topic", ("brokerGroups",), [], "spec.brokerGroups"),
        ("Topic", ("topicName",), "has space", "spec.topicName"),
        ("ConsumerGroup", ("retry", "maxAttempts"), 0, "spec.retry.maxAttempts"),
        ("CapstanUser", ("userType",), "Root", "spec.userType"),
        ("CapstanUser", ("userName",), "has space", "spec.userName"),
        ("CapstanUser", ("acl",), [{"resources": ["Bucket:x"], "actions": ["Pub"]}], "spec.acl"),
        ("CapstanUser", ("acl",), [{"resources": ["Topic:x"], "actions": ["Fly"]}], "spec.acl"),
    ],
)
def test_the_schemas_refuse_bad_fields(
    kind: str, path: tuple[str, ...], value: object, complaint: str
) -> None:
    bad = copy.deepcopy(examples()[kind])
    holder = bad["spec"]
    for name in path[:-1]:
        holder = holder.setdefault(name, {})
    holder[path[-1]] = value
    errors = schema_errors(kind, bad)
    assert errors and all(e.startswith(complaint) for e in errors), errors


# A spec that breaks each CEL rule, by the rule's message: the webhook's rules must refuse
# it with the same message and field. A CEL rule added without a twin fails the test below.
BREAKING: dict[str, tuple[str, dict[str, Any], dict[str, Any] | None]] = {
    "minInSyncReplicas must not exceed replicas": (
        "BrokerGroup",
        {"replicas": 2, "minInSyncReplicas": 3},
        None,
    ),
    "storageClassName is immutable; create a new BrokerGroup to move to another class": (
        "BrokerGroup",
        {"replicas": 1, "storage": {"size": "20Gi", "storageClassName": "fast"}},
        {"replicas": 1, "storage": {"size": "10Gi", "storageClassName": "slow"}},
    ),
    "topicName is immutable": (
        "Topic",
        {"brokerGroups": ["a"], "topicName": "B"},
        {"brokerGroups": ["a"], "topicName": "A"},
    ),
    "readQueues must not be below queues (the write queues)": (
        "Topic",
        {"brokerGroups": ["a"], "queues": 8, "readQueues": 4},
        None,
    ),
    "static is immutable; a topic cannot become static or stop being one": (
        "Topic",
        {"brokerGroups": ["a"], "static": True},
        {"brokerGroups": ["a"]},
    ),
    "a static topic's logic queue count (queues) cannot change": (
        "Topic",
        {"brokerGroups": ["a"], "static": True, "queues": 4},
        {"brokerGroups": ["a"], "static": True, "queues": 8},
    ),
    "a static topic has no readQueues; each logic queue is read where its items are kept": (
        "Topic",
        {"brokerGroups": ["a"], "static": True, "queues": 4, "readQueues": 8},
        None,
    ),
    "groupName is immutable": (
        "ConsumerGroup",
        {"brokerGroups": ["a"], "groupName": "B"},
        {"brokerGroups": ["a"], "groupName": "A"},
    ),
    "userName is immutable": (
        "CapstanUser",
        {"brokerGroups": ["a"], "userName": "b"},
        {"brokerGroups": ["a"], "userName": "a"},
    ),
    "nodePort is for listeners of type nodeport": (
        "BrokerGroup",
        {"replicas": 1, "listeners": [{"name": "a", "type": "internal", "nodePort": 30001}]},
        None,
    ),
}


def cel_rules() -> list[tuple[str, dict[str, str]]]:
    return [
        (kind, rule)
        for kind in KINDS
        for _, node in walk(schema_of(kind))
        for rule in node.get("x-kubernetes-validations", [])
    ]


def test_every_cel_rule_has_a_twin_in_the_webhook_rules() -> None:
    rules = cel_rules()
    assert {rule["message"] for _, rule in rules} == set(BREAKING)
    where = {
        rule["message"]: path.removeprefix(".").replace("[]", "[0]")
        for kind in KINDS
        for path, node in walk(schema_of(kind))
        for rule in node.get("x-kubernetes-validations", [])
    }
    for kind, rule in rules:
        breaking_kind, spec, old = BREAKING[rule["message"]]
        assert breaking_kind == kind
        errors = resource_rules.RULES[kind](spec, old)
        field = f"{where[rule['message']]}{rule['fieldPath']}"
        assert [str(e) for e in errors] == [f"{field}: {rule['message']}"]
        if old is not None:
            assert "oldSelf" in rule["rule"]
            assert resource_rules.RULES[kind](old, old) == []


def test_a_broker_group_may_let_its_clients_make_their_own_groups_and_topics() -> None:
    config = {"auto_create_group": True, "auto_create_topic": True}
    assert resource_rules.broker_group_errors({"replicas": 1, "brokerConfig": config}) == []


@pytest.mark.parametrize(
    ("config", "complaint"),
    [
        (
            {"store": {"flush_mod": "SYNC_FLUSH"}},
            "spec.brokerConfig: unknown setting store.flush_mod",
        ),
        (
            {"pop": {"max_batch_size": "many"}},
            "spec.brokerConfig: pop.max_batch_size: expected a number",
        ),
        ({"grpc_port": 9000}, "spec.brokerConfig.grpc_port: is set by the operator"),
        (
            {"replication": {"controller_address": "x:1"}},
            "spec.brokerConfig.replication.controller_address: is set by the operator",
        ),
        ({"tls": {"enabled": False}}, "spec.brokerConfig.tls.enabled: is set by the operator"),
        (
            {"auth": {"init_user_file": "/x"}},
            "spec.brokerConfig.auth.init_user_file: is set by the operator",
        ),
    ],
)
def test_a_broker_config_the_broker_would_refuse_is_refused_by_name(
    config: dict[str, Any], complaint: str
) -> None:
    errors = resource_rules.broker_group_errors({"replicas": 1, "brokerConfig": config})
    assert len(errors) == 1 and str(errors[0]).startswith(complaint), errors


@pytest.mark.parametrize(
    ("name", "good"),
    [
        ("198.18.0.5", True),
        ("fd00::1", True),
        ("mq.example.com", True),
        ("*.mq.example.com", True),
        ("has space", False),
        ("UPPER.example.com", False),
        ("-dash.example.com", False),
    ],
)
def test_a_groups_alternative_names_are_addresses_or_dns_names(name: str, good: bool) -> None:
    errors = resource_rules.broker_group_errors(
        {"replicas": 1, "tls": {"alternativeNames": ["ok.example.com", name]}}
    )
    if good:
        assert errors == []
    else:
        assert [str(e) for e in errors] == [
            f"spec.tls.alternativeNames[1]: {name!r} is neither an IP address nor a DNS name"
        ]
