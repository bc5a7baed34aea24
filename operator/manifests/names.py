"""The names and labels of what the operator creates, in one place.

A BrokerGroup `g` in namespace `ns` becomes the StatefulSet `g`, the headless Service
`g-brokers` (its pods' stable DNS names, `g-N.g-brokers.ns.svc`, under which brokers
register and are routed), the client Service `g`, the ConfigMap `g-config` and the
PodDisruptionBudget `g`. One controller serves every BrokerGroup of a namespace: the
StatefulSet and headless Service `capstan-controller`.
"""

from __future__ import annotations

BROKER_GRPC_PORT = 8081
BROKER_METRICS_PORT = 9100
CONTROLLER_GRPC_PORT = 9876
CONTROLLER_METRICS_PORT = 9101

CONTROLLER = "capstan-controller"
CONTROLLER_STATE = "capstan-controller-state"
"""The controller's state ConfigMap (its Lease is `<this>-leader`)."""

DATA_DIR = "/var/lib/capstan"
CONFIG_DIR = "/etc/capstan"
CONFIG_HASH_ANNOTATION = "capstan.io/config-hash"
MANUAL_ROLL_ANNOTATION = "capstan.io/manual-rolling-update"
ZONE_ANNOTATION = "capstan.io/zone"
"""On a broker pod of a group with spec.rack: its node's topology label, which the pod's
downward-API zone file then holds (operator/rack.py)."""
RACK_DIR = "/etc/capstan-rack"
LISTENER_LABEL = "capstan.io/listener"
"""On a listener's Service: the listener's name (the operator deletes the Services of
listeners no longer in the spec by it)."""


def listener_service(group: str, listener: str) -> str:
    return f"{group}-{listener}"


"""On a BrokerGroup or one of its pods, "true": restart them through the roller."""
MANAGED_BY = "capstan-operator"


# The secrets of a secured namespace (operator/cluster_secrets.py) and their keys.
CA_SECRET = "capstan-ca"
CLUSTER_SECRET = "capstan-cluster"
ADMIN_SECRET = "capstan-admin"
CONTROLLER_TLS_SECRET = f"{CONTROLLER}-tls"
CA_BUNDLE = "capstan-ca-bundle"
"""A ConfigMap with the namespace's trust bundle alone (ca.crt), for any client to mount."""
CLUSTER_SECRET_KEY = "cluster-secret"
ADMIN_CREDENTIALS_KEY = "admin-credentials.json"
ACCESS_KEY_KEY, SECRET_KEY_KEY = "access-key", "secret-key"
"""A user's keys in its Secret (the admin's, a CapstanUser's), one per key for env vars."""
TLS_CERT_KEY, TLS_KEY_KEY, CA_CERT_KEY = "tls.crt", "tls.key", "ca.crt"


def group_tls_secret(group: str) -> str:
    return f"{group}-tls"


def headless_service(group: str) -> str:
    return f"{group}-brokers"


def config_map(group: str) -> str:
    return f"{group}-config"


def pod_host(group: str, ordinal: int, namespace: str) -> str:
    return f"{group}-{ordinal}.{headless_service(group)}.{namespace}.svc"


def controller_addresses(namespace: str, replicas: int) -> list[str]:
    return [
        f"{CONTROLLER}-{i}.{CONTROLLER}.{namespace}.svc:{CONTROLLER_GRPC_PORT}"
        for i in range(replicas)
    ]


def component_labels(component: str) -> dict[str, str]:
    """Every pod of one component (brokers of any group, the operator, the Spark jobs)."""
    return {"app.kubernetes.io/name": "capstan", "app.kubernetes.io/component": component}


def selector_labels(instance: str, component: str) -> dict[str, str]:
    """The labels a Service, PDB and StatefulSet select their pods by (never changed)."""
    return {
        "app.kubernetes.io/name": "capstan",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
    }


def labels(instance: str, component: str) -> dict[str, str]:
    return {
        **selector_labels(instance, component),
        "app.kubernetes.io/part-of": "capstan",
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }
