"""Pieces every pod the operator builds shares."""

from __future__ import annotations

from typing import Any

from capstan.operator.manifests import names


def downward_env() -> list[dict[str, Any]]:
    def field_ref(name: str, path: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}

    return [
        field_ref("POD_NAME", "metadata.name"),
        field_ref("POD_NAMESPACE", "metadata.namespace"),
        field_ref("POD_IP", "status.podIP"),
    ]


def restricted_container() -> dict[str, Any]:
    """The restricted Pod Security Standard."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


SCRATCH = "tmp"


def scratch_volume() -> dict[str, Any]:
    """A writable /tmp under the read-only root filesystem: the image's HOME, where the
    official RocketMQ client that Capstan imports makes its log folder (~/logs) at import."""
    return {"name": SCRATCH, "emptyDir": {}}


def scratch_mount() -> dict[str, Any]:
    return {"name": SCRATCH, "mountPath": "/tmp"}


# -- TLS and the cluster's identity (operator/cluster_secrets.py makes the secrets) ------

TLS_DIR = "/var/run/capstan/tls"
CLUSTER_DIR = "/var/run/capstan/cluster"
ADMIN_DIR = "/var/run/capstan/admin"
SECRET_FILE_MODE = 0o440
"""Readable by the pod's user and fsGroup alone."""


def security_settings(with_admin: bool) -> dict[str, Any]:
    """The `tls` and `auth` settings of a pod with `security_volumes` mounted; a broker
    also creates the admin user from its keys (`with_admin`)."""
    auth: dict[str, Any] = {
        "enabled": True,
        "cluster_secret_file": f"{CLUSTER_DIR}/{names.CLUSTER_SECRET_KEY}",
    }
    if with_admin:
        auth["init_user_file"] = f"{ADMIN_DIR}/{names.ADMIN_CREDENTIALS_KEY}"
    return {
        "tls": {
            "enabled": True,
            "cert_file": f"{TLS_DIR}/{names.TLS_CERT_KEY}",
            "key_file": f"{TLS_DIR}/{names.TLS_KEY_KEY}",
            "ca_file": f"{TLS_DIR}/{names.CA_CERT_KEY}",
        },
        "auth": auth,
    }


def security_volumes(
    tls_secret: str, cluster_secret: str, admin_secret: str = ""
) -> list[dict[str, Any]]:
    """Secret volumes: the kubelet replaces their files when the secrets change (a renewed
    certificate reaches the pod without a restart). `tls` holds the pod's certificate and
    key from `tls_secret` and, as `ca.crt`, the namespace's trust bundle (a ConfigMap, which
    keeps a replaced CA until it expires, whoever issues the certificates)."""

    def secret(name: str, secret_name: str) -> dict[str, Any]:
        return {
            "name": name,
            "secret": {"secretName": secret_name, "defaultMode": SECRET_FILE_MODE},
        }

    def keys(*names_: str) -> list[dict[str, str]]:
        return [{"key": k, "path": k} for k in names_]

    tls = {
        "name": "tls",
        "projected": {
            "defaultMode": SECRET_FILE_MODE,
            "sources": [
                {
                    "secret": {
                        "name": tls_secret,
                        "items": keys(names.TLS_CERT_KEY, names.TLS_KEY_KEY),
                    }
                },
                {"configMap": {"name": names.CA_BUNDLE, "items": keys(names.CA_CERT_KEY)}},
            ],
        },
    }
    volumes = [tls, secret("cluster", cluster_secret)]
    if admin_secret:
        volumes.append(secret("admin", admin_secret))
    return volumes


def security_mounts(with_admin: bool) -> list[dict[str, Any]]:
    mounts = [
        {"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
        {"name": "cluster", "mountPath": CLUSTER_DIR, "readOnly": True},
    ]
    if with_admin:
        mounts.append({"name": "admin", "mountPath": ADMIN_DIR, "readOnly": True})
    return mounts


# -- NetworkPolicy peers ---------------------------------------------------------------

OPERATOR_COMPONENT = "operator"
SPARK_JOB_COMPONENT = "spark-job"
BROKER_COMPONENT = "broker"


def operator_peer(operator_namespace: str) -> dict[str, Any]:
    """The operator's pod (the chart's labels), in its namespace when known, else in any
    (an operator outside the cluster is not a pod and no policy admits it)."""
    namespaces: dict[str, Any] = (
        {"matchLabels": {"kubernetes.io/metadata.name": operator_namespace}}
        if operator_namespace
        else {}
    )
    return {
        "namespaceSelector": namespaces,
        "podSelector": {"matchLabels": names.component_labels(OPERATOR_COMPONENT)},
    }


def component_peer(component: str) -> dict[str, Any]:
    """Pods of `component` in the policy's own namespace."""
    return {"podSelector": {"matchLabels": names.component_labels(component)}}


def port_rule(port: int, peers: list[dict[str, Any]] | None) -> dict[str, Any]:
    """An ingress rule for one TCP port; `peers` None: from anywhere."""
    rule: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": port}]}
    if peers is not None:
        rule["from"] = peers
    return rule
