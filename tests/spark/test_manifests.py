"""The Kubernetes side of the Spark jobs: every manifest of spark/manifests/ validates
against its schema (Kubernetes' own for core kinds, the spark-operator's CRDs for
SparkApplication and ScheduledSparkApplication, with unknown fields refused), names the
entry scripts the Spark image installs and a service account the RBAC grants; the image's
Dockerfile passes hadolint; the spark-submit script is sound bash that refuses a job it
does not know."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from capstan.spark import audit, compaction

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "spark" / "manifests"
CRDS = Path(__file__).parent / "spark_operator_crds"
KUBERNETES_VERSION = "1.30.0"
SPARK_KINDS = {"SparkApplication", "ScheduledSparkApplication"}


def documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc)
        for path in sorted(MANIFESTS.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def crd_schema(kind: str) -> dict[str, Any]:
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
            return dict(version["schema"]["openAPIV3Schema"])
    raise AssertionError(f"no CRD for {kind}")


def unknown_fields(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """Fields the schema does not define (the API server would prune them silently)."""
    found = []
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key not in schema["properties"]:
                found.append(f"{where}.{key}")
            else:
                found += unknown_fields(item, schema["properties"][key], f"{where}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += unknown_fields(item, schema["items"], f"{where}[{i}]")
    return found


def test_there_are_manifests_for_both_jobs_and_their_rbac():
    kinds = sorted(doc["kind"] for _, doc in documents())
    assert kinds == [
        "Role",
        "RoleBinding",
        "ScheduledSparkApplication",
        "ServiceAccount",
        "SparkApplication",
    ]


@pytest.mark.parametrize(
    ("name", "doc"), documents(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_each_manifest_validates_against_its_schema(name: str, doc: dict[str, Any]):
    if doc["kind"] in SPARK_KINDS:
        schema = crd_schema(doc["kind"])
        jsonschema.Draft7Validator(schema).validate(doc)
        assert unknown_fields(doc, schema) == [], name
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_schema_violation_is_caught():
    """The check above can fail: a wrong type and an unknown field are both refused."""
    [(_, app)] = [(n, d) for n, d in documents() if d["kind"] == "SparkApplication"]
    schema = crd_schema("SparkApplication")
    broken = {**app, "spec": {**app["spec"], "mode": 3}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(broken)
    typo = {**app, "spec": {**app["spec"], "mainAplicationFile": "x"}}
    assert unknown_fields(typo, schema) == [".spec.mainAplicationFile"]


def test_the_applications_run_the_installed_jobs_under_the_granted_account():
    docs = [d for _, d in documents()]
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    bound = {s["name"] for d in docs if d["kind"] == "RoleBinding" for s in d["subjects"]}
    dockerfile = (REPO / "spark" / "Dockerfile").read_text()
    for d in docs:
        if d["kind"] not in SPARK_KINDS:
            continue
        spec = d["spec"].get("template", d["spec"])
        script = spec["mainApplicationFile"].removeprefix("local://")
        assert script.startswith("/opt/capstan/jobs/")
        name = Path(script).name
        assert (REPO / "spark" / "jobs" / name).is_file()
        assert f"spark/jobs/{name}" in dockerfile
        assert spec["driver"]["serviceAccount"] in accounts & bound
        assert spec["type"] == "Python"


def test_the_job_scripts_take_the_arguments_the_manifests_give():
    for _, d in documents():
        if d["kind"] not in SPARK_KINDS:
            continue
        spec = d["spec"].get("template", d["spec"])
        job = Path(spec["mainApplicationFile"]).stem
        module = {"compact": compaction, "audit": audit}[job]
        # The job's own parser, as its main() uses it: a wrong argument exits (SystemExit).
        args = module.arguments(list(spec["arguments"]))
        assert args.server or args.controller or args.brokers, spec["arguments"]


def test_the_spark_image_passes_hadolint():
    hadolint = Path(sys.executable).parent / "hadolint"
    done = subprocess.run(
        [str(hadolint), str(REPO / "spark" / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_spark_submit_script_refuses_an_unknown_job():
    script = MANIFESTS / "spark-submit.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    done = subprocess.run(["bash", str(script), "vacuum"], capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr


def test_the_spark_submit_script_submits_to_kubernetes_in_cluster_mode():
    done = subprocess.run(
        ["bash", str(MANIFESTS / "spark-submit.sh"), "compact", "Prices", "--server", "c:9876"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "SPARK_SUBMIT": "echo", "K8S_API": "https://10.0.0.1:6443"},
    )
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[:4] == ["--master", "k8s://https://10.0.0.1:6443", "--deploy-mode", "cluster"]
    assert "spark.kubernetes.authenticate.driver.serviceAccountName=capstan-spark" in words
    assert words[-4:] == [
        "local:///opt/capstan/jobs/compact.py",
        "Prices",
        "--server",
        "c:9876",
    ]
