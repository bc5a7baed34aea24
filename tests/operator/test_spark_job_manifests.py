"""The scheduled Spark jobs the operator builds: a compact Topic's compaction CronJob and a
BrokerGroup's audit CronJob, valid for the server they are built for, running the job with
the arguments the resource gives and reporting into its status under an account that may
do only that."""

from __future__ import annotations

from typing import Any

import kubernetes_validate

from capstan.operator.manifests import spark_jobs
from capstan.operator.manifests.cluster import ClusterFacts
from capstan.security.credentials import client_access

OLD = ClusterFacts(minor=20, policy_v1=False, service_monitors=False, batch_v1_cronjob=False)
NEW = ClusterFacts(minor=30, policy_v1=True, service_monitors=True, batch_v1_cronjob=True)


def resource(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "capstan.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "shop", "uid": "u-1"},
        "spec": spec,
    }


def container(cronjob: dict[str, Any]) -> dict[str, Any]:
    [found] = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return dict(found)


def test_a_compact_topic_gets_a_cronjob_running_the_compaction_with_its_settings() -> None:
    topic = resource(
        "Topic",
        "prices",
        {"topicName": "Prices", "compaction": {"schedule": "@daily", "tombstoneRetentionMs": 5}},
    )
    built = spark_jobs.compaction_cronjob(topic, NEW, "capstan-spark:9")
    kubernetes_validate.validate(built, "1.30.0", strict=True)
    assert (built["apiVersion"], built["metadata"]["name"]) == ("batch/v1", "prices-compaction")
    assert built["spec"]["schedule"] == "@daily" and built["spec"]["concurrencyPolicy"] == "Forbid"
    c = container(built)
    assert c["image"] == "capstan-spark:9"
    assert c["command"] == [
        "capstan", "spark", "compact", "Prices",
        "--server", "capstan-controller-0.capstan-controller.shop.svc:9876",
        "--master", "local[2]",
        "--verbose",
        "--status-of", "topics/shop/prices",
        "--tombstone-retention-ms", "5",
    ]  # fmt: skip
    assert built["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    pod = built["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == spark_jobs.JOB_ACCOUNT and pod["restartPolicy"] == "Never"
    three = spark_jobs.compaction_cronjob(topic, NEW, "i", controller_replicas=3)
    assert container(three)["command"][5] == ",".join(
        f"capstan-controller-{i}.capstan-controller.shop.svc:9876" for i in range(3)
    )  # every replica: the job finds the leader among them
    default = spark_jobs.compaction_cronjob(resource("Topic", "t", {}), OLD, "i")
    assert default["apiVersion"] == "batch/v1beta1"
    assert default["spec"]["schedule"] == spark_jobs.DEFAULT_COMPACTION_SCHEDULE
    assert container(default)["command"][3] == "t"  # the resource's name by default


def test_an_audit_cronjob_only_with_a_schedule() -> None:
    assert spark_jobs.audit_cronjob(resource("BrokerGroup", "g", {}), NEW, "i") is None
    group = resource(
        "BrokerGroup", "g", {"audit": {"schedule": "*/30 * * * *", "pushgateway": "pg:9091"}}
    )
    built = spark_jobs.audit_cronjob(group, NEW, "i")
    assert built is not None
    kubernetes_validate.validate(built, "1.30.0", strict=True)
    command = container(built)["command"]
    assert command[:3] == ["capstan", "spark", "audit"]
    assert command[command.index("--status-of") + 1] == "brokergroups/shop/g"
    assert command[command.index("--pushgateway") + 1] == "pg:9091"


def test_a_job_of_a_secured_namespace_is_given_the_ca_bundle_and_the_admins_keys() -> None:
    """What the job's clients read (capstan.security.credentials.client_access) is what the
    pod's environment gives: a CA file on the mounted bundle and the admin Secret's keys."""
    topic = resource("Topic", "prices", {"compaction": {"schedule": "@daily"}})
    built = spark_jobs.compaction_cronjob(topic, NEW, "i", secure=True)
    kubernetes_validate.validate(built, "1.30.0", strict=True)
    c = container(built)
    env = {e["name"]: e for e in c["env"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    pod = built["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["ca"]["configMap"]["name"] == "capstan-ca-bundle"
    assert env["CAPSTAN_CA"]["value"] == f"{mounts['ca']}/ca.crt"
    for name, key in (("CAPSTAN_ACCESS_KEY", "access-key"), ("CAPSTAN_SECRET_KEY", "secret-key")):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "capstan-admin", "key": key}
    access = client_access(
        {
            "CAPSTAN_CA": env["CAPSTAN_CA"]["value"],
            "CAPSTAN_ACCESS_KEY": "a",
            "CAPSTAN_SECRET_KEY": "s",
        }
    )
    assert access["ca_file"] == "/var/run/capstan/ca/ca.crt"
    assert access["credentials"] is not None and access["credentials"].access_key == "a"
    group = resource("BrokerGroup", "g", {"audit": {"schedule": "@hourly"}})
    audit = spark_jobs.audit_cronjob(group, NEW, "i", secure=True)
    assert audit is not None and "CAPSTAN_CA" in {e["name"] for e in container(audit)["env"]}
    open_job = container(spark_jobs.compaction_cronjob(topic, NEW, "i"))
    assert not {"CAPSTAN_CA", "CAPSTAN_ACCESS_KEY"} & {e["name"] for e in open_job["env"]}
    assert client_access({}) == {"ca_file": None, "credentials": None}


def test_the_jobs_account_may_only_read_the_resources_and_patch_their_status() -> None:
    owner = {"apiVersion": "capstan.io/v1alpha1", "kind": "BrokerGroup", "name": "g"}
    owner |= {"uid": "5c0e1a4e-0000-4000-8000-000000000001", "controller": False}
    objects = spark_jobs.job_account("shop", [owner])
    for obj in objects:
        kubernetes_validate.validate(obj, "1.30.0", strict=True)
    assert all(o["metadata"]["ownerReferences"] == [owner] for o in objects)
    [role] = [o for o in objects if o["kind"] == "Role"]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {
        ("topics", "get"),
        ("brokergroups", "get"),
        ("topics/status", "get"),
        ("topics/status", "patch"),
        ("brokergroups/status", "get"),
        ("brokergroups/status", "patch"),
    }
