"""The scheduled Spark jobs: a CronJob compacting each compact Topic (`spec.compaction`) and
a CronJob auditing a BrokerGroup's cluster when `spec.audit.schedule` is set.

Each run is one pod of the Spark image running the job in local mode (`capstan spark
compact|audit --master local[2]`), reading through the brokers like any client, and writing
its result into the resource's status itself (`--status-of`): status.compaction of the
Topic, status.audit of the BrokerGroup. The pods run as the `capstan-spark-jobs` service
account, which may read those resources and patch their status, nothing else. A CronJob is
owned by its resource and goes with it. CronJob is served as batch/v1 from 1.21, before
that as batch/v1beta1. In a secured namespace the job trusts the namespace's CA bundle and
signs as its admin user (capstan-admin), both given by environment variables.
"""

from __future__ import annotations

from typing import Any

from capstan.operator.manifests import names
from capstan.operator.manifests.cluster import ClusterFacts, owner_reference
from capstan.operator.manifests.pod_parts import SPARK_JOB_COMPONENT
from capstan.security.credentials import ACCESS_KEY_ENV, CA_ENV, SECRET_KEY_ENV

JOB_ACCOUNT = "capstan-spark-jobs"
DEFAULT_COMPACTION_SCHEDULE = "0 * * * *"
SPARK_MASTER = "local[2]"
RUN_DEADLINE_S = 3600
COMPONENT = SPARK_JOB_COMPONENT
CA_BUNDLE_DIR = "/var/run/capstan/ca"


def cronjob_api(facts: ClusterFacts) -> str:
    return "batch/v1" if facts.batch_v1_cronjob else "batch/v1beta1"


def compaction_name(topic_resource: str) -> str:
    return f"{topic_resource}-compaction"[:52]  # a CronJob's name leaves room for its Jobs'


def audit_name(group: str) -> str:
    return f"{group}-audit"[:52]


def job_account(namespace: str, owners: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The service account the jobs run as, with the right to report their result; owned by
    every resource of the namespace that schedules a job (`owners`, ownerReferences), so it
    goes with the last of them."""
    labels = names.labels(JOB_ACCOUNT, COMPONENT)
    meta = {
        "name": JOB_ACCOUNT,
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": owners,
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [
                {
                    "apiGroups": ["capstan.io"],
                    "resources": ["topics", "brokergroups"],
                    "verbs": ["get"],
                },
                {
                    "apiGroups": ["capstan.io"],
                    "resources": ["topics/status", "brokergroups/status"],
                    "verbs": ["get", "patch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": JOB_ACCOUNT,
            },
            "subjects": [{"kind": "ServiceAccount", "name": JOB_ACCOUNT, "namespace": namespace}],
        },
    ]


def compaction_cronjob(
    topic: dict[str, Any],
    facts: ClusterFacts,
    image: str,
    secure: bool = False,
    controller_replicas: int = 1,
) -> dict[str, Any]:
    """The CronJob compacting a compact Topic resource (`topic` is its body); `secure`:
    over TLS, signed with the namespace's admin keys. The job is given every controller
    replica and finds the leader among them."""
    meta, spec = topic["metadata"], topic.get("spec") or {}
    namespace = meta["namespace"]
    settings = spec.get("compaction") or {}
    command = [
        "capstan", "spark", "compact", spec.get("topicName") or meta["name"],
        "--server", _controllers(namespace, controller_replicas),
        "--master", SPARK_MASTER,
        "--verbose",  # the pod's log is the job's log: Spark's own lines stay in it
        "--status-of", f"topics/{namespace}/{meta['name']}",
    ]  # fmt: skip
    if "tombstoneRetentionMs" in settings:
        command += ["--tombstone-retention-ms", str(int(settings["tombstoneRetentionMs"]))]
    return _cronjob(
        topic,
        facts,
        compaction_name(meta["name"]),
        str(settings.get("schedule") or DEFAULT_COMPACTION_SCHEDULE),
        bool(settings.get("suspend", False)),
        image,
        command,
        secure,
    )


def audit_cronjob(
    group: dict[str, Any],
    facts: ClusterFacts,
    image: str,
    secure: bool = False,
    controller_replicas: int = 1,
) -> dict[str, Any] | None:
    """The CronJob auditing the cluster of a BrokerGroup resource; None without a schedule."""
    meta, spec = group["metadata"], group.get("spec") or {}
    settings = spec.get("audit") or {}
    if not settings.get("schedule"):
        return None
    namespace = meta["namespace"]
    command = [
        "capstan", "spark", "audit",
        "--server", _controllers(namespace, controller_replicas),
        "--master", SPARK_MASTER,
        "--verbose",
        "--status-of", f"brokergroups/{namespace}/{meta['name']}",
    ]  # fmt: skip
    if settings.get("pushgateway"):
        command += ["--pushgateway", str(settings["pushgateway"]), "--cluster", namespace]
    return _cronjob(
        group,
        facts,
        audit_name(meta["name"]),
        str(settings["schedule"]),
        bool(settings.get("suspend", False)),
        image,
        command,
        secure,
    )


def _cronjob(
    owner: dict[str, Any],
    facts: ClusterFacts,
    name: str,
    schedule: str,
    suspend: bool,
    image: str,
    command: list[str],
    secure: bool,
) -> dict[str, Any]:
    namespace = owner["metadata"]["namespace"]
    labels = names.labels(name, COMPONENT)
    container: dict[str, Any] = {
        "name": "job",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": [
            {"name": "SPARK_LOCAL_DIRS", "value": "/tmp"},
            # Spark finds its own address from this, not from the host name (which a pod's
            # resolver may not know).
            {
                "name": "SPARK_LOCAL_IP",
                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
            },
        ],
        "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        },
    }
    volumes: list[dict[str, Any]] = [{"name": "scratch", "emptyDir": {}}]
    if secure:
        container["env"] += _access_env()
        container["volumeMounts"].append(
            {"name": "ca", "mountPath": CA_BUNDLE_DIR, "readOnly": True}
        )
        volumes.append({"name": "ca", "configMap": {"name": names.CA_BUNDLE}})
    pod = {
        "metadata": {"labels": labels},
        "spec": {
            "serviceAccountName": JOB_ACCOUNT,
            "restartPolicy": "Never",
            "containers": [container],
            "volumes": volumes,
        },
    }
    return {
        "apiVersion": cronjob_api(facts),
        "kind": "CronJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "schedule": schedule,
            "suspend": suspend,
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 1,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "metadata": {"labels": labels},
                "spec": {
                    "backoffLimit": 0,
                    "activeDeadlineSeconds": RUN_DEADLINE_S,
                    "template": pod,
                },
            },
        },
    }


def _access_env() -> list[dict[str, Any]]:
    """How the job reaches a secured cluster (capstan/security/credentials.py reads these):
    the namespace's trust bundle, and the admin's keys from their Secret."""

    def from_admin(env: str, key: str) -> dict[str, Any]:
        return {
            "name": env,
            "valueFrom": {"secretKeyRef": {"name": names.ADMIN_SECRET, "key": key}},
        }

    return [
        {"name": CA_ENV, "value": f"{CA_BUNDLE_DIR}/{names.CA_CERT_KEY}"},
        from_admin(ACCESS_KEY_ENV, names.ACCESS_KEY_KEY),
        from_admin(SECRET_KEY_ENV, names.SECRET_KEY_KEY),
    ]


def _controllers(namespace: str, replicas: int) -> str:
    return ",".join(names.controller_addresses(namespace, max(1, replicas)))
