"""The objects the operator builds: every field that matters, and every object valid against
the Kubernetes OpenAPI schemas (kubernetes-validate, strict) of an old and a new version."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
import yaml

from capstan.common.broker_settings import load_broker_settings
from capstan.controller.settings import load_controller_settings
from capstan.operator.manifests import names
from capstan.operator.manifests.broker_group import BrokerGroupManifests, BrokerGroupSpec
from capstan.operator.manifests.cluster import ClusterFacts
from capstan.operator.manifests.controller import ControllerManifests
from tests.operator.test_crds import examples, schema_of

OLD = ClusterFacts(minor=20, policy_v1=False, service_monitors=False, batch_v1_cronjob=False)
NEW = ClusterFacts(minor=30, policy_v1=True, service_monitors=True)


def body(spec: dict[str, Any] | None = None) -> dict[str, Any]:
    example = copy.deepcopy(examples()["BrokerGroup"])
    example["metadata"].update(namespace="shop", uid="8d6e-uid")
    if spec is not None:
        example["spec"] = spec
    return example


def built(spec: dict[str, Any] | None = None, facts: ClusterFacts = NEW) -> BrokerGroupManifests:
    return BrokerGroupManifests(body(spec), facts)


def test_the_spec_defaults_are_the_crds_defaults() -> None:
    props = schema_of("BrokerGroup")["properties"]["spec"]["properties"]
    d = BrokerGroupSpec()
    assert (d.replicas, d.min_in_sync_replicas) == (
        props["replicas"]["default"],
        props["minInSyncReplicas"]["default"],
    )
    assert (d.image_pull_policy, d.anti_affinity) == (
        props["imagePullPolicy"]["default"],
        props["antiAffinity"]["default"],
    )
    assert "default" not in props["image"]  # the operator's image (operator/image_default.py)
    assert d.storage_size == props["storage"]["properties"]["size"]["default"]
    assert d.termination_grace_s == props["terminationGracePeriodSeconds"]["default"]
    assert d.service_monitor is props["metrics"]["properties"]["serviceMonitor"]["default"]
    policy = props["networkPolicy"]["properties"]
    assert d.network_policy is policy["enabled"]["default"]
    assert list(d.client_peers) == policy["clients"]["default"]
    assert d.metrics_tls is props["tls"]["properties"]["metrics"]["default"]


def test_the_stateful_set_leaves_restarts_to_the_roller_and_keeps_a_claim_per_pod() -> None:
    sts = built().stateful_set()
    spec = sts["spec"]
    assert sts["metadata"]["name"] == "broker-a"
    assert spec["replicas"] == 3
    assert spec["updateStrategy"] == {"type": "OnDelete"}
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["serviceName"] == "broker-a-brokers"
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert "storageClassName" not in claim["spec"]
    classed = built({"replicas": 1, "storage": {"size": "1Gi", "storageClassName": "fast"}})
    (claim,) = classed.stateful_set()["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast"
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


def test_brokers_listen_on_the_pod_ip_and_register_under_their_stable_dns_name(
    tmp_path: Any,
) -> None:
    m = built()
    (container,) = m.stateful_set()["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["capstan"]
    args = container["args"]
    assert args[:3] == ["broker", "--config", "/etc/capstan/broker.yaml"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_IP": "status.podIP",
    }
    # What the broker of pod broker-a-1 runs, once Kubernetes expanded $(VAR) in its args.
    pod_env = {"POD_NAME": "broker-a-1", "POD_NAMESPACE": "shop", "POD_IP": "10.1.2.3"}
    expanded = [_expand(a, pod_env) for a in args]
    config = tmp_path / "broker.yaml"
    config.write_text(m.config_map()["data"]["broker.yaml"])
    overrides = [expanded[i + 1] for i, a in enumerate(expanded) if a == "--set"]
    settings = load_broker_settings(config, overrides)
    assert settings.listen_host == "10.1.2.3"
    assert settings.advertised_host == names.pod_host("broker-a", 1, "shop")
    assert settings.advertised_host == "broker-a-1.broker-a-brokers.shop.svc"
    assert settings.broker_name == "broker-a" and settings.data_dir == names.DATA_DIR
    assert settings.route_endpoint == "broker-a.shop.svc:8081"  # clients go by the Service
    assert settings.replication.controller_address == (
        "capstan-controller-0.capstan-controller.shop.svc:9876"
    )
    assert (settings.replication.replicas, settings.replication.min_in_sync_replicas) == (3, 2)
    assert settings.store.file_reserved_hours == 48  # from spec.brokerConfig
    # The port stays open while kube-proxy still sends new connections to a deleted pod.
    assert settings.shutdown_delay_s == 3
    config.write_text(
        built({"brokerConfig": {"shutdown_delay_s": 0}}).config_map()["data"]["broker.yaml"]
    )
    assert load_broker_settings(config, overrides).shutdown_delay_s == 0  # brokerConfig wins


def _expand(arg: str, env: dict[str, str]) -> str:
    for name, value in env.items():
        arg = arg.replace(f"$({name})", value)
    return arg


def test_probes_use_grpc_where_the_cluster_has_grpc_probes_and_http_before() -> None:
    new = built(facts=NEW).stateful_set()["spec"]["template"]["spec"]["containers"][0]
    assert new["readinessProbe"]["grpc"] == {"port": 8081}
    assert new["livenessProbe"]["grpc"] == {"port": 8081}
    old = built(facts=OLD).stateful_set()["spec"]["template"]["spec"]["containers"][0]
    assert old["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert old["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert "grpc" not in old["readinessProbe"]


def test_liveness_counts_only_once_the_broker_serves_so_a_long_recovery_is_not_killed() -> None:
    for facts in (NEW, OLD):
        container = built(facts=facts).stateful_set()["spec"]["template"]["spec"]["containers"][0]
        startup, ready = container["startupProbe"], container["readinessProbe"]
        # The startup probe asks what readiness asks (serving: the store recovered) ...
        assert {k: v for k, v in startup.items() if k in ("grpc", "httpGet")} == {
            k: v for k, v in ready.items() if k in ("grpc", "httpGet")
        }
        # ... and waits an hour for it, where liveness alone would restart after a minute.
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600
        live = container["livenessProbe"]
        assert live["periodSeconds"] * live["failureThreshold"] <= 60


@pytest.mark.parametrize(
    ("mode", "key"),
    [
        ("preferred", "preferredDuringSchedulingIgnoredDuringExecution"),
        ("required", "requiredDuringSchedulingIgnoredDuringExecution"),
        ("none", None),
    ],
)
def test_anti_affinity_spreads_the_groups_pods_over_nodes(mode: str, key: str | None) -> None:
    pod = built({"replicas": 3, "antiAffinity": mode}).stateful_set()["spec"]["template"]["spec"]
    if key is None:
        assert "affinity" not in pod
        return
    (term,) = pod["affinity"]["podAntiAffinity"][key]
    term = term.get("podAffinityTerm", term)
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == names.selector_labels("broker-a", "broker")


def test_the_grace_period_outlasts_the_masters_handover() -> None:
    pod = built({"replicas": 2, "terminationGracePeriodSeconds": 10}).stateful_set()
    assert pod["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 5 + 15
    slow = built(
        {"replicas": 2, "brokerConfig": {"replication": {"handover_timeout_ms": 30_000}}}
    ).stateful_set()
    assert slow["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30 + 15
    longer = built({"replicas": 2, "terminationGracePeriodSeconds": 120}).stateful_set()
    assert longer["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 120


def test_resources_and_the_restricted_security_context_reach_the_container() -> None:
    pod = built().stateful_set()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"] == {  # the example's (crds/examples/brokergroup.yaml)
        "requests": {"cpu": "250m", "memory": "1Gi"},
        "limits": {"memory": "2Gi"},
    }
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False  # no API rights a broker never uses


def test_a_config_change_rolls_the_pods_but_growing_the_group_does_not() -> None:
    base = body()["spec"]
    annotation = names.CONFIG_HASH_ANNOTATION

    def hash_of(spec: dict[str, Any]) -> str:
        template = built(spec).stateful_set()["spec"]["template"]
        return str(template["metadata"]["annotations"][annotation])

    assert hash_of(base) == hash_of(copy.deepcopy(base))
    changed = copy.deepcopy(base) | {"brokerConfig": {"store": {"file_reserved_hours": 24}}}
    assert hash_of(changed) != hash_of(base)
    assert hash_of(base | {"replicas": 5}) == hash_of(base)
    assert hash_of(base | {"replicas": 1, "minInSyncReplicas": 2}) != hash_of(
        base | {"replicas": 2, "minInSyncReplicas": 2}
    )
    assert hash_of(base | {"minInSyncReplicas": 1}) != hash_of(base)


def test_services_give_stable_names_to_every_pod_and_clients_the_ready_ones() -> None:
    m = built()
    headless = m.headless_service()
    assert headless["metadata"]["name"] == "broker-a-brokers"
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    client = m.client_service()
    assert client["metadata"]["name"] == "broker-a"
    assert client["spec"]["type"] == "ClusterIP" and "publishNotReadyAddresses" not in client
    assert [p["port"] for p in client["spec"]["ports"]] == [8081]
    selector = names.selector_labels("broker-a", "broker")
    pod_labels = m.stateful_set()["spec"]["template"]["metadata"]["labels"]
    for service in (headless, client):
        assert service["spec"]["selector"] == selector
        assert selector.items() <= pod_labels.items()


@pytest.mark.parametrize(
    ("replicas", "min_in_sync", "budget"),
    [
        (3, 2, {"minAvailable": 2}),
        (3, 3, {"minAvailable": 3}),
        (5, 2, {"minAvailable": 4}),
        (1, 1, {"maxUnavailable": 1}),
    ],
)
def test_the_disruption_budget_keeps_min_in_sync_and_takes_one_at_a_time(
    replicas: int, min_in_sync: int, budget: dict[str, int]
) -> None:
    spec = {"replicas": replicas, "minInSyncReplicas": min_in_sync}
    pdb = built(spec).pod_disruption_budget()
    assert pdb["apiVersion"] == "policy/v1"
    assert {k: v for k, v in pdb["spec"].items() if k != "selector"} == budget
    assert built(spec, OLD).pod_disruption_budget()["apiVersion"] == "policy/v1beta1"


def test_a_service_monitor_only_where_its_crd_exists_and_the_resource_wants_one() -> None:
    assert built(facts=OLD).service_monitor() is None
    assert built({"replicas": 1, "metrics": {"serviceMonitor": False}}).service_monitor() is None
    monitor = built().service_monitor()
    assert monitor is not None
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s"}
    ]
    kinds = [c["kind"] for c in built().children()]
    assert kinds == [
        "ConfigMap",
        "Service",
        "Service",
        "PodDisruptionBudget",
        "StatefulSet",
        "ServiceMonitor",
        "NetworkPolicy",
    ]


def test_every_child_is_owned_by_its_broker_group() -> None:
    for child in built().children():
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "capstan.io/v1alpha1",
            "kind": "BrokerGroup",
            "name": "broker-a",
            "uid": "8d6e-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert child["metadata"]["namespace"] == "shop"


def controller(facts: ClusterFacts = NEW) -> ControllerManifests:
    owners = [
        {"apiVersion": "capstan.io/v1alpha1", "kind": "BrokerGroup", "name": n, "uid": n}
        | {"controller": False, "blockOwnerDeletion": True}
        for n in ("a", "b")
    ]
    return ControllerManifests("shop", owners, facts)


def test_the_controller_keeps_its_state_in_kubernetes_with_only_the_rights_it_needs() -> None:
    c = controller()
    (container,) = c.stateful_set()["spec"]["template"]["spec"]["containers"]
    sets = dict(a.split("=", 1) for a in container["args"][2::2])
    assert container["args"][0] == "controller"
    assert sets["state.backend"] == "kubernetes"
    assert sets["state.namespace"] == "$(POD_NAMESPACE)"
    assert sets["listen_host"] == "$(POD_IP)" and sets["controller_id"] == "$(POD_NAME)"
    assert c.stateful_set()["spec"]["template"]["spec"]["serviceAccountName"] == names.CONTROLLER
    resources = {(r["apiGroups"][0], r["resources"][0]) for r in c.role()["rules"]}
    assert resources == {("", "configmaps"), ("coordination.k8s.io", "leases")}
    assert "delete" not in c.role()["rules"][0]["verbs"]
    for child in c.children():
        assert [o["name"] for o in child["metadata"]["ownerReferences"]] == ["a", "b"]
        assert not any(o["controller"] for o in child["metadata"]["ownerReferences"])


def test_only_the_leading_controller_is_ready_yet_every_replica_keeps_its_name() -> None:
    """Readiness is /readyz, which answers 200 on the leader alone: `kubectl get pods` shows
    who leads; the headless Service still publishes every replica's name, so brokers and
    the operator reach a follower that takes over at once."""
    c = controller()
    (container,) = c.stateful_set()["spec"]["template"]["spec"]["containers"]
    probe = container["readinessProbe"]
    assert probe["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert probe["periodSeconds"] <= 2 and probe["failureThreshold"] == 1
    # A loaded pod's answer may take over the kubelet's 1-s default.
    assert probe["timeoutSeconds"] >= 3 and container["livenessProbe"]["timeoutSeconds"] >= 3
    assert c.service()["spec"]["publishNotReadyAddresses"] is True


def projected_files(volume: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Each file of a projected volume: the kind and name of the object it comes from."""
    out = {}
    for source in volume["projected"]["sources"]:
        ((kind, ref),) = source.items()
        for item in ref["items"]:
            out[item["path"]] = (kind, ref["name"])
    return out


def test_a_secured_group_and_controller_serve_tls_and_check_signatures_from_mounted_secrets(
    tmp_path: Any,
) -> None:
    """What the broker and the controller of a secured namespace load is what the mounted
    secrets hold, and probes go over HTTP (the kubelet's gRPC probe has no TLS)."""
    m = BrokerGroupManifests(body(), NEW, secure=True)
    pod = m.stateful_set()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {v["name"]: v["mountPath"] for v in container["volumeMounts"]}
    assert volumes["cluster"]["secret"]["secretName"] == names.CLUSTER_SECRET
    assert volumes["admin"]["secret"]["secretName"] == names.ADMIN_SECRET
    assert all(volumes[v]["secret"]["defaultMode"] == 0o440 for v in ("cluster", "admin"))
    assert volumes["tls"]["projected"]["defaultMode"] == 0o440
    tls_files = projected_files(volumes["tls"])
    assert pod["securityContext"]["fsGroup"] == 10001  # the secrets' files are readable
    config = tmp_path / "broker.yaml"
    config.write_text(m.config_map()["data"]["broker.yaml"])
    settings = load_broker_settings(config)
    assert settings.tls.enabled and settings.auth.enabled
    # The pod's own pair from its Secret; the peers' CAs from the namespace's trust bundle.
    tls = settings.tls
    in_tls = {
        p: tls_files[p.removeprefix(mounts["tls"] + "/")]
        for p in (tls.cert_file, tls.key_file, tls.ca_file)
    }
    assert in_tls == {
        settings.tls.cert_file: ("secret", "broker-a-tls"),
        settings.tls.key_file: ("secret", "broker-a-tls"),
        settings.tls.ca_file: ("configMap", names.CA_BUNDLE),
    }
    assert settings.auth.cluster_secret_file == f"{mounts['cluster']}/cluster-secret"
    assert settings.auth.init_user_file == f"{mounts['admin']}/admin-credentials.json"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "httpGet" in container[probe] and "grpc" not in container[probe]
    # Turning security on or off rolls the pods.
    assert m.config_hash() != built().config_hash()

    c = ControllerManifests("shop", [], NEW, secure=True)
    cpod = c.stateful_set()["spec"]["template"]["spec"]
    (ccontainer,) = cpod["containers"]
    sets = [a for i, a in enumerate(ccontainer["args"]) if ccontainer["args"][i - 1] == "--set"]
    csettings = load_controller_settings(None, sets)
    assert csettings.tls.enabled and csettings.auth.enabled
    assert csettings.auth.cluster_secret_file.startswith("/var/run/capstan/cluster/")
    cvolumes = {v["name"]: v for v in cpod["volumes"]}
    assert projected_files(cvolumes["tls"]) == {
        "tls.crt": ("secret", names.CONTROLLER_TLS_SECRET),
        "tls.key": ("secret", names.CONTROLLER_TLS_SECRET),
        "ca.crt": ("configMap", names.CA_BUNDLE),
    }
    assert "admin" not in cvolumes  # the controller holds no user's keys
    assert cpod["securityContext"]["fsGroup"] == 10001
    assert "httpGet" in ccontainer["livenessProbe"]


def test_network_policies_admit_clients_as_the_spec_says_and_the_clusters_own_pods() -> None:
    m = BrokerGroupManifests(body(), NEW, operator_namespace="capstan-system")
    policy = m.network_policy()
    assert policy is not None
    assert policy["spec"]["podSelector"]["matchLabels"] == names.selector_labels(
        "broker-a", "broker"
    )
    grpc_rule, metrics_rule = policy["spec"]["ingress"]
    assert grpc_rule["ports"] == [{"protocol": "TCP", "port": 8081}]
    peers = grpc_rule["from"]
    assert peers[0] == {"podSelector": {}}  # default: every pod of the namespace
    labels = [p.get("podSelector", {}).get("matchLabels", {}) for p in peers]
    assert names.selector_labels("broker-a", "broker") in labels  # replication
    assert names.selector_labels(names.CONTROLLER, "controller") in labels
    assert {
        "app.kubernetes.io/name": "capstan",
        "app.kubernetes.io/component": "spark-job",
    } in labels
    operator = next(p for p in peers if "namespaceSelector" in p)
    assert operator["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "capstan-system"}
    }
    assert "from" not in metrics_rule  # scraped from anywhere by default

    chosen = [{"namespaceSelector": {"matchLabels": {"team": "billing"}}}]
    narrowed = BrokerGroupManifests(
        body({**body()["spec"], "networkPolicy": {"clients": chosen, "metrics": []}}), NEW
    ).network_policy()
    assert narrowed is not None
    assert narrowed["spec"]["ingress"][0]["from"][0] == chosen[0]
    assert {"podSelector": {}} not in narrowed["spec"]["ingress"][0]["from"]
    assert narrowed["spec"]["ingress"][1]["from"] == []  # nobody scrapes
    off = BrokerGroupManifests(body({**body()["spec"], "networkPolicy": {"enabled": False}}), NEW)
    assert off.network_policy() is None
    assert "NetworkPolicy" not in [c["kind"] for c in off.children()]

    c = ControllerManifests("shop", [], NEW, operator_namespace="capstan-system").network_policy()
    (rule, metrics) = c["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9876}]
    components = [
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in rule["from"]
    ]
    assert components == ["broker", "operator", "spark-job"]
    assert "from" not in metrics


@pytest.mark.parametrize(("facts", "version"), [(NEW, "1.30.0"), (OLD, "1.25.0")])
@pytest.mark.parametrize("secure", [False, True], ids=["open", "secure"])
def test_every_object_is_valid_against_the_kubernetes_openapi_schemas(
    facts: ClusterFacts, version: str, secure: bool
) -> None:
    objects = (
        BrokerGroupManifests(body(), facts, secure=secure).children()
        + ControllerManifests("shop", [], facts, secure=secure).children()
    )
    for obj in objects:
        if obj["kind"] == "ServiceMonitor" or obj["apiVersion"] == "policy/v1beta1":
            continue  # not in the bundled schemas: a CRD, and a version gone in 1.25
        kubernetes_validate.validate(yaml.safe_load(yaml.safe_dump(obj)), version, strict=True)
    wrong = built(facts=facts).stateful_set()
    wrong["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSecond"] = 5
    with pytest.raises(kubernetes_validate.ValidationError, match="periodSecond"):
        kubernetes_validate.validate(wrong, version, strict=True)


def test_https_metrics_turn_the_probes_and_the_service_monitor_to_https(tmp_path: Any) -> None:
    """spec.tls.metrics in a secured namespace: the broker serves its metrics port over
    HTTPS, the kubelet probes it so, and Prometheus scrapes it trusting the bundle and
    checking the Service's name; without security it changes nothing."""
    spec = {"tls": {"metrics": True}}
    m = BrokerGroupManifests(body(spec), NEW, secure=True)
    config = tmp_path / "broker.yaml"
    config.write_text(m.config_map()["data"]["broker.yaml"])
    assert load_broker_settings(config).tls.metrics
    (container,) = m.stateful_set()["spec"]["template"]["spec"]["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    monitor = m.service_monitor()
    assert monitor is not None
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "ca": {"configMap": {"name": names.CA_BUNDLE, "key": "ca.crt"}},
        "serverName": "broker-a.shop.svc",
    }
    # Plain metrics by default: the same secured group, without spec.tls.metrics.
    plain = BrokerGroupManifests(body(), NEW, secure=True)
    assert "metrics" not in plain.broker_config()["tls"]
    (plain_container,) = plain.stateful_set()["spec"]["template"]["spec"]["containers"]
    assert "scheme" not in plain_container["readinessProbe"]["httpGet"]
    assert plain.config_hash() != m.config_hash()  # turning it on rolls the pods
    insecure = BrokerGroupManifests(body(spec), NEW, secure=False)
    assert "tls" not in insecure.broker_config()
    insecure_monitor = insecure.service_monitor()
    assert insecure_monitor is not None and "scheme" not in insecure_monitor["spec"]["endpoints"][0]
