"""The CRDs' CEL rules (x-kubernetes-validations) on a server that runs them
(apiextensions-apiserver 1.36, tests/kube/cel_server.py; the control plane's 1.20 drops
them). Every rule of every CRD in crds/ has a case here, found by its text: an object that
keeps it is accepted, one that breaks it is refused (422) with the rule's own message, and
the breaking object passes the OpenAPI schema, so the rule and not the schema refuses it.
A transition rule (one naming `oldSelf`) is checked on a replace of a stored object, and
does not hold on a create."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube.cel_server import CelServer
from tests.operator.test_crds import CRD_DIR, examples, schema_errors, walk

pytestmark = pytest.mark.slow

Changes = dict[str, Any]
"""Changes to a kind's example spec (crds/examples/): a mapping merges into the example's
mapping, None removes the key, anything else replaces the value."""


@dataclass(frozen=True)
class RuleCase:
    """One CEL rule (its text as in the CRD) and the spec changes that keep and break it.
    `before`, for a transition rule, is the object stored first and then replaced."""

    name: str
    kind: str
    rule: str
    keeps: Changes
    breaks: Changes
    before: Changes | None = field(default=None)


CASES = (
    RuleCase(
        name="broker-group-min-in-sync-within-replicas",
        kind="BrokerGroup",
        rule="self.minInSyncReplicas <= self.replicas",
        keeps={"replicas": 3, "minInSyncReplicas": 3},
        breaks={"replicas": 2, "minInSyncReplicas": 3},
    ),
    RuleCase(
        name="broker-group-storage-class-immutable",
        kind="BrokerGroup",
        rule="!has(oldSelf.storage) || !has(self.storage) || "
        "(has(self.storage.storageClassName) ? self.storage.storageClassName : '') == "
        "(has(oldSelf.storage.storageClassName) ? oldSelf.storage.storageClassName : '')",
        before={"storage": {"storageClassName": "fast"}},
        keeps={"storage": {"storageClassName": "fast", "size": "40Gi"}},
        breaks={"storage": {"storageClassName": "slow"}},
    ),
    RuleCase(
        name="broker-group-node-port-only-on-nodeport-listeners",
        kind="BrokerGroup",
        rule="self.type == 'nodeport' || !has(self.nodePort)",
        keeps={"listeners": [{"name": "outside", "type": "nodeport", "nodePort": 30100}]},
        breaks={"listeners": [{"name": "inside", "type": "internal", "nodePort": 30100}]},
    ),
    RuleCase(
        name="topic-name-immutable",
        kind="Topic",
        rule="!has(oldSelf.topicName) || "
        "(has(self.topicName) && self.topicName == oldSelf.topicName)",
        before={},
        keeps={"queues": 16},
        breaks={"topicName": "Invoices"},
    ),
    RuleCase(
        name="topic-read-queues-not-below-queues",
        kind="Topic",
        rule="!has(self.readQueues) || self.readQueues >= self.queues",
        keeps={"queues": 8, "readQueues": 16},
        breaks={"queues": 8, "readQueues": 4},
    ),
    RuleCase(
        name="topic-static-immutable",
        kind="Topic",
        rule="(has(self.static) && self.static) == (has(oldSelf.static) && oldSelf.static)",
        before={},
        keeps={"queues": 16},
        breaks={"static": True},
    ),
    RuleCase(
        name="topic-static-queue-count-immutable",
        kind="Topic",
        rule="!(has(self.static) && self.static) || self.queues == oldSelf.queues",
        before={"static": True, "queues": 8},
        keeps={"brokerGroups": ["broker-a", "broker-b"]},
        breaks={"queues": 4},
    ),
    RuleCase(
        name="topic-static-has-no-read-queues",
        kind="Topic",
        rule="!(has(self.static) && self.static) || !has(self.readQueues)",
        keeps={"static": True, "queues": 4},
        breaks={"static": True, "queues": 4, "readQueues": 8},
    ),
    RuleCase(
        name="consumer-group-name-immutable",
        kind="ConsumerGroup",
        rule="!has(oldSelf.groupName) || "
        "(has(self.groupName) && self.groupName == oldSelf.groupName)",
        before={},
        keeps={"retry": {"maxAttempts": 7}},
        breaks={"groupName": "Shipping"},
    ),
    RuleCase(
        name="user-name-immutable",
        kind="CapstanUser",
        rule="!has(oldSelf.userName) || (has(self.userName) && self.userName == oldSelf.userName)",
        before={"userName": "billing-app"},
        keeps={"userName": "billing-app", "enabled": False},
        breaks={"userName": "billing-ops"},
    ),
)
TRANSITION_CASES = [case for case in CASES if case.before is not None]
PLAIN_CASES = [case for case in CASES if case.before is None]


@dataclass(frozen=True)
class CrdRule:
    kind: str
    plural: str
    at: str
    """Where in the schema the rule sits, e.g. `.spec.listeners[]`."""
    rule: str
    message: str


def one_line(rule: str) -> str:
    return " ".join(rule.split())


def crd_files() -> list[Path]:
    return sorted(CRD_DIR.glob("*.yaml"))


def rules_in_crds() -> list[CrdRule]:
    """Every x-kubernetes-validations rule of every version of every CRD in crds/."""
    found: list[CrdRule] = []
    for path in crd_files():
        crd = yaml.safe_load(path.read_text())
        names = crd["spec"]["names"]
        for version in crd["spec"]["versions"]:
            for at, node in walk(version["schema"]["openAPIV3Schema"]):
                found.extend(
                    CrdRule(names["kind"], names["plural"], at, one_line(r["rule"]), r["message"])
                    for r in node.get("x-kubernetes-validations", [])
                )
    return found


def rule_of(case: RuleCase) -> CrdRule:
    for rule in rules_in_crds():
        if (rule.kind, rule.rule) == (case.kind, one_line(case.rule)):
            return rule
    raise AssertionError(f"no {case.kind} CRD has the rule {case.rule!r} any more")


def with_changes(spec: dict[str, Any], changes: Changes) -> dict[str, Any]:
    changed = copy.deepcopy(spec)
    for key, value in changes.items():
        if value is None:
            changed.pop(key, None)
        elif isinstance(value, dict) and isinstance(changed.get(key), dict):
            changed[key] = with_changes(changed[key], value)
        else:
            changed[key] = copy.deepcopy(value)
    return changed


def example_with(kind: str, namespace: str, *changes: Changes) -> dict[str, Any]:
    """The kind's example in `namespace`, with each set of changes applied in turn."""
    obj = copy.deepcopy(examples()[kind])
    obj["metadata"]["namespace"] = namespace
    for change in changes:
        obj["spec"] = with_changes(obj["spec"], change)
    return obj


def fresh_namespace() -> str:
    return f"cel-{uuid.uuid4().hex[:8]}"


def assert_refused_by_the_rule(answer: tuple[int, str], rule: CrdRule, obj: dict[str, Any]) -> None:
    status, message = answer
    assert status == 422, f"expected 422 naming {rule.message!r}, got {status}: {message}"
    assert rule.message in message, message
    assert schema_errors(rule.kind, obj) == [], "the schema alone refuses the breaking object"


@pytest.fixture(scope="module")
def cel_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CelServer]:
    """One server for the module, with every CRD of crds/ established."""
    with CelServer(tmp_path_factory.mktemp("cel-server")) as server:
        for path in crd_files():
            server.apply_crd(path)
        yield server


def test_every_rule_in_the_crds_has_a_case() -> None:
    found = {(rule.kind, rule.rule): rule for rule in rules_in_crds()}
    covered = {(case.kind, one_line(case.rule)) for case in CASES}
    without_case = [
        f"{rule.kind} at {rule.at}: {rule.rule} ({rule.message})"
        for key, rule in found.items()
        if key not in covered
    ]
    assert not without_case, f"CEL rules without a case in CASES: {without_case}"
    assert not covered - found.keys(), f"cases of rules no CRD has: {covered - found.keys()}"
    assert len({case.name for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", PLAIN_CASES, ids=lambda case: case.name)
def test_a_rule_accepts_an_object_that_keeps_it_and_refuses_one_that_breaks_it(
    cel_server: CelServer, case: RuleCase
) -> None:
    rule = rule_of(case)
    namespace = fresh_namespace()
    keeping = example_with(case.kind, namespace, case.keeps)
    breaking = example_with(case.kind, namespace, case.breaks)
    assert cel_server.create(rule.plural, keeping) == (201, "")
    breaking["metadata"]["name"] += "-breaks"
    assert_refused_by_the_rule(cel_server.create(rule.plural, breaking), rule, breaking)


@pytest.mark.parametrize("case", TRANSITION_CASES, ids=lambda case: case.name)
def test_a_transition_rule_refuses_a_replace_that_breaks_it_and_takes_one_that_keeps_it(
    cel_server: CelServer, case: RuleCase
) -> None:
    rule = rule_of(case)
    assert "oldSelf" in rule.rule
    namespace = fresh_namespace()
    assert case.before is not None
    stored = example_with(case.kind, namespace, case.before)
    assert cel_server.create(rule.plural, stored) == (201, "")
    breaking = example_with(case.kind, namespace, case.before, case.breaks)
    assert_refused_by_the_rule(cel_server.replace(rule.plural, breaking), rule, breaking)
    keeping = example_with(case.kind, namespace, case.before, case.keeps)
    assert cel_server.replace(rule.plural, keeping) == (200, "")


@pytest.mark.parametrize("case", TRANSITION_CASES, ids=lambda case: case.name)
def test_a_transition_rule_does_not_hold_a_new_object(
    cel_server: CelServer, case: RuleCase
) -> None:
    rule = rule_of(case)
    assert case.before is not None
    fresh = example_with(case.kind, fresh_namespace(), case.before, case.breaks)
    assert cel_server.create(rule.plural, fresh) == (201, "")


@pytest.mark.parametrize(
    "case",
    [case for case in TRANSITION_CASES if case.name.endswith("-name-immutable")],
    ids=lambda case: case.name,
)
def test_removing_an_immutable_name_is_refused_by_the_rule_itself(
    cel_server: CelServer, case: RuleCase
) -> None:
    """Not by an evaluation error of the rule ("no such key"): the rule's verdict."""
    rule = rule_of(case)
    assert case.before is not None
    namespace = fresh_namespace()
    stored = example_with(case.kind, namespace, case.before)
    (name_field,) = [key for key in case.breaks if key.endswith("Name")]
    assert name_field in stored["spec"], stored["spec"]
    assert cel_server.create(rule.plural, stored) == (201, "")
    removed = example_with(case.kind, namespace, case.before, {name_field: None})
    answer = cel_server.replace(rule.plural, removed)
    assert_refused_by_the_rule(answer, rule, removed)
    assert "no such key" not in answer[1], answer
