"""A BrokerGroup's children: StatefulSet, headless and client Services, ConfigMap, PDB and
ServiceMonitor.

Pods are restarted by the operator's roller alone (`updateStrategy: OnDelete`), in the order
operator/roller.py decides; the StatefulSet's own rolling update never runs. A change of the
broker config changes the pod template (its hash is an annotation), so the pods become
outdated and the roller replaces them. Brokers listen on their pod IP and register with the
controller under their stable DNS names (names.pod_host), never under pod IPs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from capstan.operator.manifests import names
from capstan.operator.manifests.cluster import ClusterFacts, owner_reference
from capstan.operator.manifests.pod_parts import (
    SPARK_JOB_COMPONENT,
    component_peer,
    downward_env,
    operator_peer,
    port_rule,
    restricted_container,
    scratch_mount,
    scratch_volume,
    security_mounts,
    security_settings,
    security_volumes,
)
from capstan.operator.manifests.pod_template import lay_over

COMPONENT = "broker"
CONTROLLER_COMPONENT = "controller"
HANDOVER_MARGIN_S = 15
"""The grace period must leave a stopping master this long beyond its handover timeout."""
STARTUP_WINDOW_S = 3600
"""How long a broker may take to recover its store and serve before the kubelet restarts it."""
DEFAULT_IMAGE = "capstan:0.1.0"
SHUTDOWN_DELAY_S = 3.0
"""A stopping broker keeps its port open this long after SIGTERM (brokerConfig's
shutdown_delay_s wins): kube-proxy drops a deleted pod from a Service a moment after the
pod learns it is going, and meanwhile a new connection to a closed port is refused."""
"""The operator's own image when it is not told one (`capstan operator --image`)."""


@dataclass(frozen=True)
class BrokerGroupSpec:
    """spec of a BrokerGroup, with the CRD's defaults (tests hold the two equal)."""

    replicas: int = 2
    min_in_sync_replicas: int = 1
    image: str = DEFAULT_IMAGE
    """spec.image, else the operator's own image (operator/image_default.py)."""
    image_pull_policy: str = "IfNotPresent"
    resources: Mapping[str, Any] = field(default_factory=dict)
    storage_size: str = "10Gi"
    storage_class: str = ""
    anti_affinity: str = "preferred"
    termination_grace_s: int = 30
    broker_config: Mapping[str, Any] = field(default_factory=dict)
    service_monitor: bool = True
    network_policy: bool = True
    client_peers: tuple[Mapping[str, Any], ...] = ({"podSelector": {}},)
    metrics_peers: tuple[Mapping[str, Any], ...] | None = None
    metrics_tls: bool = False
    template: Mapping[str, Any] = field(default_factory=dict)
    """spec.template: the user's pod and container settings (pod_template.py)."""
    rack_key: str = ""
    """spec.rack.topologyKey: the node label naming a node's zone; "" for no rack."""
    listeners: tuple[Mapping[str, Any], ...] = ()
    """spec.listeners: the Services clients may come in by besides the group's own."""

    @classmethod
    def of(cls, spec: Mapping[str, Any], default_image: str = DEFAULT_IMAGE) -> BrokerGroupSpec:
        """`default_image`: what a spec naming no image runs (the operator's image)."""
        storage = spec.get("storage") or {}
        policy = spec.get("networkPolicy") or {}
        d = cls()
        return cls(
            replicas=spec.get("replicas", d.replicas),
            min_in_sync_replicas=spec.get("minInSyncReplicas", d.min_in_sync_replicas),
            image=spec.get("image") or default_image,
            image_pull_policy=spec.get("imagePullPolicy", d.image_pull_policy),
            resources=spec.get("resources") or {},
            storage_size=storage.get("size", d.storage_size),
            storage_class=storage.get("storageClassName", ""),
            anti_affinity=spec.get("antiAffinity", d.anti_affinity),
            termination_grace_s=spec.get("terminationGracePeriodSeconds", d.termination_grace_s),
            broker_config=spec.get("brokerConfig") or {},
            service_monitor=(spec.get("metrics") or {}).get("serviceMonitor", d.service_monitor),
            network_policy=policy.get("enabled", d.network_policy),
            client_peers=tuple(policy.get("clients", d.client_peers)),
            metrics_peers=tuple(policy["metrics"]) if "metrics" in policy else None,
            metrics_tls=bool((spec.get("tls") or {}).get("metrics", d.metrics_tls)),
            template=spec.get("template") or {},
            rack_key=str((spec.get("rack") or {}).get("topologyKey") or ""),
            listeners=tuple(spec.get("listeners") or ()),
        )


@dataclass(frozen=True)
class BrokerGroupManifests:
    """Everything built for one BrokerGroup resource."""

    body: Mapping[str, Any]
    """The resource as the API server returned it."""
    facts: ClusterFacts
    controller_replicas: int = 1
    secure: bool = False
    """TLS on every port and authentication on, from the namespace's secrets
    (operator/cluster_secrets.py)."""
    operator_namespace: str = ""
    """Where the operator's pod runs (its NetworkPolicy peer); "" when unknown."""
    default_image: str = DEFAULT_IMAGE
    """The brokers' image when spec.image names none: the operator's own."""

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def spec(self) -> BrokerGroupSpec:
        return BrokerGroupSpec.of(self.body.get("spec") or {}, self.default_image)

    def _metadata(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": names.labels(self.name, COMPONENT),
            "ownerReferences": [owner_reference(dict(self.body))],
        }

    def broker_config(self) -> dict[str, Any]:
        """The broker YAML every pod of the group shares; each pod adds its own address
        with --set (the downward API gives it the pod's name and IP)."""
        s = self.spec
        config: dict[str, Any] = {key: _copy(value) for key, value in s.broker_config.items()}
        config.setdefault("shutdown_delay_s", SHUTDOWN_DELAY_S)
        config.update(
            broker_name=self.name,
            route_endpoint=f"{self.name}.{self.namespace}.svc:{names.BROKER_GRPC_PORT}",
            grpc_port=names.BROKER_GRPC_PORT,
            http_port=names.BROKER_METRICS_PORT,
        )
        replication = dict(config.get("replication") or {})
        replication.update(
            controller_address=",".join(
                names.controller_addresses(self.namespace, self.controller_replicas)
            ),
            replicas=s.replicas,
            min_in_sync_replicas=s.min_in_sync_replicas,
        )
        config["replication"] = replication
        if self.secure:
            config.update(security_settings(with_admin=True))
            if self._https_metrics:
                config["tls"]["metrics"] = True
        return config

    @property
    def _https_metrics(self) -> bool:
        """The metrics port serves HTTPS (spec.tls.metrics, in a secured namespace)."""
        return self.secure and self.spec.metrics_tls

    def config_text(self) -> str:
        return yaml.safe_dump(self.broker_config(), sort_keys=True)

    def config_map(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": self._metadata(names.config_map(self.name)),
            "data": {"broker.yaml": self.config_text()},
        }

    def headless_service(self) -> dict[str, Any]:
        """Gives each pod its DNS name, ready or not: brokers must find each other and the
        controller while they start."""
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self._metadata(names.headless_service(self.name)),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": names.selector_labels(self.name, COMPONENT),
                "ports": _broker_ports(),
            },
        }

    def client_service(self) -> dict[str, Any]:
        """The address clients start from: any ready broker answers routes, which then
        name every replica by its stable DNS name."""
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self._metadata(self.name),
            "spec": {
                "type": "ClusterIP",
                "selector": names.selector_labels(self.name, COMPONENT),
                "ports": _broker_ports()[:1],
            },
        }

    def listener_services(self) -> list[dict[str, Any]]:
        """One Service per listener, in front of every broker pod: any replica serves a
        client (a slave passes writes on to the master), and routes name the address the
        client came in by, so a client stays on its listener through a failover."""
        made = []
        for listener in self.spec.listeners:
            name, kind = str(listener["name"]), str(listener["type"])
            port: dict[str, Any] = {
                "name": "grpc",
                "port": names.BROKER_GRPC_PORT,
                "targetPort": "grpc",
                "protocol": "TCP",
            }
            spec: dict[str, Any] = {
                "type": _SERVICE_TYPES[kind],
                "selector": names.selector_labels(self.name, COMPONENT),
                "ports": [port],
            }
            if kind == "nodeport" and listener.get("nodePort"):
                port["nodePort"] = int(listener["nodePort"])
            if kind == "loadbalancer" and listener.get("allowFrom"):
                spec["loadBalancerSourceRanges"] = [str(c) for c in listener["allowFrom"]]
            metadata = self._metadata(names.listener_service(self.name, name))
            metadata["labels"] = {**metadata["labels"], names.LISTENER_LABEL: name}
            if listener.get("annotations"):
                metadata["annotations"] = {
                    str(k): str(v) for k, v in listener["annotations"].items()
                }
            made.append({"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec})
        return made

    def _outside_clients(self) -> list[dict[str, Any]]:
        """NetworkPolicy peers for the external listeners' `allowFrom` (default anywhere):
        a NodePort or load balancer brings clients from outside any pod selector."""
        cidrs: list[str] = []
        for listener in self.spec.listeners:
            if listener["type"] in ("nodeport", "loadbalancer"):
                cidrs += [str(c) for c in listener.get("allowFrom") or ("0.0.0.0/0", "::/0")]
        return [{"ipBlock": {"cidr": c}} for c in dict.fromkeys(cidrs)]

    def pod_disruption_budget(self) -> dict[str, Any]:
        """Voluntary evictions (a node drain) keep minInSyncReplicas brokers, and take at
        most one at a time; a single replica may be evicted (there is nothing to keep)."""
        s = self.spec
        budget: dict[str, Any] = (
            {"maxUnavailable": 1}
            if s.replicas == 1
            else {"minAvailable": max(s.min_in_sync_replicas, s.replicas - 1)}
        )
        return {
            "apiVersion": "policy/v1" if self.facts.policy_v1 else "policy/v1beta1",
            "kind": "PodDisruptionBudget",
            "metadata": self._metadata(self.name),
            "spec": {
                **budget,
                "selector": {"matchLabels": names.selector_labels(self.name, COMPONENT)},
            },
        }

    def service_monitor(self) -> dict[str, Any] | None:
        if not (self.facts.service_monitors and self.spec.service_monitor):
            return None
        tls: dict[str, Any] = {}
        if self._https_metrics:
            # Prometheus trusts the namespace's bundle and checks the Service's name.
            bundle = {"configMap": {"name": names.CA_BUNDLE, "key": names.CA_CERT_KEY}}
            tls = {
                "scheme": "https",
                "tlsConfig": {"ca": bundle, "serverName": f"{self.name}.{self.namespace}.svc"},
            }
        return {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": self._metadata(self.name),
            "spec": {
                "selector": {
                    "matchLabels": {
                        **names.selector_labels(self.name, COMPONENT),
                    }
                },
                "namespaceSelector": {"matchNames": [self.namespace]},
                "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s", **tls}],
            },
        }

    def network_policy(self) -> dict[str, Any] | None:
        """Ingress to the group's pods: the gRPC port from the spec's clients, the group's
        own pods (replication, forwarding to the master), the namespace's controller (its
        admin and route fronts), the operator and the scheduled Spark jobs; the metrics port
        from the spec's scrapers (default anyone). None when the spec turns it off."""
        s = self.spec
        if not s.network_policy:
            return None
        ours = [
            {"podSelector": {"matchLabels": names.selector_labels(self.name, COMPONENT)}},
            {
                "podSelector": {
                    "matchLabels": names.selector_labels(names.CONTROLLER, CONTROLLER_COMPONENT)
                }
            },
            operator_peer(self.operator_namespace),
            component_peer(SPARK_JOB_COMPONENT),
        ]
        clients = [_copy(dict(p)) for p in s.client_peers]
        metrics = None if s.metrics_peers is None else [_copy(dict(p)) for p in s.metrics_peers]
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": self._metadata(self.name),
            "spec": {
                "podSelector": {"matchLabels": names.selector_labels(self.name, COMPONENT)},
                "policyTypes": ["Ingress"],
                "ingress": [
                    port_rule(names.BROKER_GRPC_PORT, [*clients, *self._outside_clients(), *ours]),
                    port_rule(names.BROKER_METRICS_PORT, metrics),
                ],
            },
        }

    def stateful_set(self, replicas: int | None = None) -> dict[str, Any]:
        """`replicas` overrides the spec's while a scale-down waits for its turn."""
        s = self.spec
        selector = names.selector_labels(self.name, COMPONENT)
        host = f"$(POD_NAME).{names.headless_service(self.name)}.$(POD_NAMESPACE).svc"
        container: dict[str, Any] = {
            "name": "broker",
            "image": s.image,
            "imagePullPolicy": s.image_pull_policy,
            "command": ["capstan"],
            "args": [
                "broker",
                "--config",
                f"{names.CONFIG_DIR}/broker.yaml",
                "--set",
                f"data_dir={names.DATA_DIR}",
                "--set",
                "listen_host=$(POD_IP)",
                "--set",
                f"advertised_host={host}",
            ],
            "env": downward_env(),
            "ports": [
                {"name": "grpc", "containerPort": names.BROKER_GRPC_PORT, "protocol": "TCP"},
                {"name": "metrics", "containerPort": names.BROKER_METRICS_PORT, "protocol": "TCP"},
            ],
            # Liveness waits for the store's recovery, however long a big store takes: the
            # startup probe passes once the broker serves, and only then does liveness count.
            # Both probed every second, so a restarted broker is back in its Services about
            # a second after it serves (5 s each cost up to 10 s after a power loss, and a
            # client's reconnect backoff grows meanwhile: 1, 1.6, 2.6, 4.1 s apart).
            "startupProbe": self._probe("/readyz", period_s=1, failures=STARTUP_WINDOW_S),
            "readinessProbe": self._probe("/readyz", period_s=1, failures=5),
            "livenessProbe": self._probe("/healthz", period_s=10, failures=6),
            "volumeMounts": [
                {"name": "data", "mountPath": names.DATA_DIR},
                {"name": "config", "mountPath": names.CONFIG_DIR, "readOnly": True},
                scratch_mount(),
                *(security_mounts(with_admin=True) if self.secure else ()),
            ],
            "securityContext": restricted_container(),
        }
        if s.resources:
            container["resources"] = _copy(s.resources)
        pod_spec: dict[str, Any] = {
            "terminationGracePeriodSeconds": max(s.termination_grace_s, self.minimum_grace_s()),
            "automountServiceAccountToken": False,  # brokers never call the API server
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "fsGroup": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [container],
            "volumes": [
                {"name": "config", "configMap": {"name": names.config_map(self.name)}},
                scratch_volume(),
                *(
                    security_volumes(
                        names.group_tls_secret(self.name), names.CLUSTER_SECRET, names.ADMIN_SECRET
                    )
                    if self.secure
                    else ()
                ),
            ],
        }
        affinity = _anti_affinity(s.anti_affinity, selector)
        if affinity:
            pod_spec["affinity"] = affinity
        pod_template = {
            "metadata": {
                "labels": names.labels(self.name, COMPONENT),
                "annotations": {names.CONFIG_HASH_ANNOTATION: self.config_hash()},
            },
            "spec": pod_spec,
        }
        lay_over(s.template, pod_template, container)
        if s.rack_key:
            _spread_over_zones(pod_spec, container, s.rack_key, selector)
        claim_spec: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": s.storage_size}},
        }
        if s.storage_class:
            claim_spec["storageClassName"] = s.storage_class
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": self._metadata(self.name),
            "spec": {
                "replicas": s.replicas if replicas is None else replicas,
                "serviceName": names.headless_service(self.name),
                "podManagementPolicy": "Parallel",
                "updateStrategy": {"type": "OnDelete"},
                "selector": {"matchLabels": selector},
                "template": pod_template,
                "volumeClaimTemplates": [
                    {
                        "metadata": {
                            "name": "data",
                            "labels": names.labels(self.name, COMPONENT),
                        },
                        "spec": claim_spec,
                    }
                ],
            },
        }

    def _probe(self, http_path: str, period_s: int, failures: int) -> dict[str, Any]:
        """The gRPC health service where the cluster runs gRPC probes (1.24+) and the port
        is plaintext (the kubelet's gRPC probe has no TLS), else the same check over the
        metrics port's HTTP endpoint."""
        check: dict[str, Any] = (
            {"grpc": {"port": names.BROKER_GRPC_PORT}}
            if self.facts.grpc_probes and not self.secure
            else {"httpGet": {"path": http_path, "port": "metrics"}}
        )
        if self._https_metrics and "httpGet" in check:
            check["httpGet"]["scheme"] = "HTTPS"  # the kubelet does not verify it
        return {
            **check,
            "periodSeconds": period_s,
            "failureThreshold": failures,
            "timeoutSeconds": 3,
        }

    def config_hash(self) -> str:
        """The hash of what a running broker would do differently with the new config: a
        change rolls the pods. `replicas` changes a broker's acknowledgement only between
        one and several (under a controller a write waits for the SyncStateSet, whatever
        its size), so growing a group from 2 to 3 does not restart the pods already there."""
        config = self.broker_config()
        config["replication"]["replicas"] = min(config["replication"]["replicas"], 2)
        text = yaml.safe_dump(config, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def minimum_grace_s(self) -> int:
        """A stopping master hands over within handover_timeout_ms; leave it that plus a
        margin for the calls to finish, or the kubelet kills it mid-handover."""
        replication = self.spec.broker_config.get("replication") or {}
        handover_ms = replication.get("handover_timeout_ms", 5_000)
        return -(-int(handover_ms) // 1000) + HANDOVER_MARGIN_S

    def children(self, replicas: int | None = None) -> list[dict[str, Any]]:
        """Every child, in the order they are applied (config before the pods that read it)."""
        built = [
            self.config_map(),
            self.headless_service(),
            self.client_service(),
            *self.listener_services(),
            self.pod_disruption_budget(),
            self.stateful_set(replicas),
        ]
        extras = (self.service_monitor(), self.network_policy())
        return built + [extra for extra in extras if extra is not None]


_SERVICE_TYPES = {"internal": "ClusterIP", "nodeport": "NodePort", "loadbalancer": "LoadBalancer"}


def _copy(value: Any) -> Any:
    return yaml.safe_load(yaml.safe_dump(value))


def _broker_ports() -> list[dict[str, Any]]:
    return [
        {"name": "grpc", "port": names.BROKER_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
        {
            "name": "metrics",
            "port": names.BROKER_METRICS_PORT,
            "targetPort": "metrics",
            "protocol": "TCP",
        },
    ]


def _spread_over_zones(
    pod_spec: dict[str, Any], container: dict[str, Any], key: str, selector: Mapping[str, str]
) -> None:
    """spec.rack: pods only on nodes with the zone label `key`, at most one more in any zone
    than in another; each broker reads its zone from a downward-API file of the pod's
    capstan.io/zone annotation, which the operator sets from the node (operator/rack.py).
    Laid after the user's template: its node terms and spread constraints are kept."""
    pod_spec["topologySpreadConstraints"] = [
        *(pod_spec.get("topologySpreadConstraints") or ()),
        {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": dict(selector)},
        },
    ]
    labelled = {"key": key, "operator": "Exists"}
    affinity = pod_spec.setdefault("affinity", {})
    node = affinity.setdefault("nodeAffinity", {})
    required = node.setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []}
    )
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:  # the terms are alternatives: each must ask for the label
        term["matchExpressions"] = [*(term.get("matchExpressions") or ()), labelled]
    pod_spec["volumes"].append(
        {
            "name": "rack",
            "downwardAPI": {
                "items": [
                    {
                        "path": "zone",
                        "fieldRef": {
                            "fieldPath": f"metadata.annotations['{names.ZONE_ANNOTATION}']"
                        },
                    }
                ]
            },
        }
    )
    container["volumeMounts"].append(
        {"name": "rack", "mountPath": names.RACK_DIR, "readOnly": True}
    )
    container["args"] += ["--set", f"zone_file={names.RACK_DIR}/zone"]


def _anti_affinity(mode: str, selector: Mapping[str, str]) -> dict[str, Any] | None:
    term = {
        "labelSelector": {"matchLabels": dict(selector)},
        "topologyKey": "kubernetes.io/hostname",
    }
    if mode == "required":
        return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    if mode == "preferred":
        weighted = {"weight": 100, "podAffinityTerm": term}
        return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [weighted]}}
    return None
