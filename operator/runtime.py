"""`capstan operator`: the Kopf runtime with Capstan's handlers, liveness and metrics.

Before Kopf starts, the operator checks that it can reach the API server with the
credentials it was given (in-cluster service account, `--kubeconfig`, or $KUBECONFIG), so a
wrong address or token ends in one line instead of an endless retry. Kopf then watches the
namespaces it is told to (or all of them), serves its liveness endpoint
(`/healthz` on `--liveness-port`), and the operator's metrics are on `--metrics-port`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import signal
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
import urllib3
from kubernetes import client, config

from capstan.common.http_endpoints import HttpEndpoints
from capstan.kube.lease import CoordinationLease
from capstan.kube.rest import KubeRest
from capstan.operator import (
    broker_group_handlers,
    consumer_group_handlers,
    topic_handlers,
    user_handlers,
    webhook,
)
from capstan.operator.cluster_security import CertManagerIssuing, ClusterSecurity
from capstan.operator.kube_objects import KubeObjects
from capstan.operator.leader_election import (
    ACTING_LABEL,
    LEASE_NAME,
    LeaderElection,
    identity,
)
from capstan.operator.manifests.cluster import ClusterFacts
from capstan.operator.metrics import OperatorMetrics
from capstan.operator.operator_context import OperatorContext
from capstan.operator.stoppable_timers import STOP_POLLING_S
from capstan.operator.webhook import WebhookOptions

log = logging.getLogger(__name__)

FINALIZER = "capstan.io/finalizer"


class ClusterUnreachable(Exception):
    """The API server cannot be reached or refuses the credentials."""


@dataclass(frozen=True)
class OperatorOptions:
    namespaces: Sequence[str]
    """Namespaces to watch; empty with `all_namespaces` for the whole cluster."""
    all_namespaces: bool
    kubeconfig: str | None
    listen_host: str = "0.0.0.0"
    liveness_port: int = 8080
    metrics_port: int = 9090
    image: str = "capstan:0.1.0"
    """The image of the controller pods the operator runs (brokers take theirs from the
    BrokerGroup)."""
    controller_replicas: int = 1
    spark_image: str = "capstan-spark:0.1.0"
    """The image of the scheduled compaction and audit jobs (spark/Dockerfile)."""
    webhook: WebhookOptions | None = None
    """The validating webhook's server; None serves none (the handlers still refuse a
    spec that breaks a rule, with a Degraded condition)."""
    own_namespace: str = ""
    """The namespace of the operator's pod, which the NetworkPolicies it makes admit; ""
    when it runs outside the cluster."""
    secure: bool = True
    """Run every namespace's cluster with TLS and authentication on, from a CA,
    certificates and a cluster secret the operator makes there (cluster_secrets.py)."""
    cert_manager: CertManagerIssuing | None = None
    """With `secure`: the servers' certificates come from cert-manager (cert_manager.py),
    not from a CA the operator runs."""
    leader_election: bool = False
    """Act only while holding the Lease `leader_election_lease` in `own_namespace`
    (leader_election.py); without it, this process is the one operator."""
    leader_election_lease: str = LEASE_NAME
    controller_template: Mapping[str, Any] | None = None
    """The controller pods' template (pod_template.py), from --controller-template."""
    work_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "capstan-operator")
    """Where the operator keeps files of its own (each namespace's trust bundle)."""


def load_credentials(kubeconfig: str | None) -> client.ApiClient:
    """An API client from the service account in a pod, else from the kubeconfig."""
    try:
        if kubeconfig is None:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
            except config.ConfigException:
                config.load_kube_config()  # type: ignore[no-untyped-call]
        else:
            config.load_kube_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError) as exc:
        raise ClusterUnreachable(f"no Kubernetes credentials: {exc}") from None
    return client.ApiClient()


def _checking_client(api: client.ApiClient) -> client.ApiClient:
    """A copy of `api` that tries each request once: the check's answer is its result."""
    settings = copy.deepcopy(api.configuration)
    settings.retries = False
    return client.ApiClient(settings)


def server_version(api: client.ApiClient) -> str:
    """The API server's version, e.g. v1.20.2: proof that address and credentials work."""
    where = api.configuration.host
    try:
        info = client.VersionApi(_checking_client(api)).get_code(_request_timeout=10)
    except client.ApiException as exc:
        raise ClusterUnreachable(
            f"the API server at {where} refused: {exc.status} {exc.reason}"
        ) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ClusterUnreachable(f"cannot reach the API server at {where}: {reason}") from None
    return str(info.git_version)


def connection_info(settings: client.Configuration) -> kopf.ConnectionInfo:
    """Kopf's credentials from the ones the operator loaded (service account, --kubeconfig
    or $KUBECONFIG); Kopf's own login would look only in the pod and ~/.kube/config."""
    header = settings.get_api_key_with_prefix("BearerToken") or settings.get_api_key_with_prefix(
        "authorization"
    )
    scheme, _, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=settings.host,
        ca_path=settings.ssl_ca_cert,
        insecure=not settings.verify_ssl,
        username=settings.username or None,
        password=settings.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=settings.cert_file,
        private_key_path=settings.key_file,
    )


def cluster_facts(kube: KubeObjects, version: str) -> ClusterFacts:
    """What the server serves that changes what the operator builds (discovery, once)."""
    digits = "".join(ch for ch in version.split(".")[1] if ch.isdigit()) if "." in version else ""
    return ClusterFacts(
        minor=int(digits or 0),
        policy_v1=kube.has_api("policy/v1", "PodDisruptionBudget"),
        service_monitors=kube.has_api("monitoring.coreos.com/v1", "ServiceMonitor"),
        batch_v1_cronjob=kube.has_api("batch/v1", "CronJob"),
    )


def build_registry(
    ctx: OperatorContext, listen_host: str = "0.0.0.0", hook: WebhookOptions | None = None
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    if hook is not None:
        webhook.register(registry, ctx)
    broker_group_handlers.register(registry, ctx)
    topic_handlers.register(registry, ctx)
    consumer_group_handlers.register(registry, ctx)
    user_handlers.register(registry, ctx)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(ctx.kube.configuration)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        # A timer still running when its object is deleted is looked at again this often
        # (Kopf's default, 60 s, held every deletion behind a busy timer that long).
        settings.background.cancellation_polling = STOP_POLLING_S
        if hook is not None:
            webhook.configure(settings, listen_host, hook)

    return registry


def run_operator(options: OperatorOptions) -> int:
    api = load_credentials(options.kubeconfig)
    version = server_version(api)
    metrics = OperatorMetrics()
    kube = KubeObjects(api)
    facts = cluster_facts(kube, version)
    security = (
        ClusterSecurity(kube, options.work_dir, options.cert_manager) if options.secure else None
    )
    ctx = OperatorContext(
        kube,
        facts,
        metrics,
        options.image,
        options.controller_replicas,
        options.spark_image,
        options.own_namespace,
        security,
        controller_template=options.controller_template,
    )
    registry = build_registry(ctx, options.listen_host, options.webhook)
    where = "all namespaces" if options.all_namespaces else ", ".join(options.namespaces)
    print(f"Capstan operator is up: Kubernetes {version}, watching {where}", flush=True)
    print(
        f"  liveness : http://{options.listen_host}:{options.liveness_port}/healthz",
        flush=True,
    )
    print(
        f"  metrics  : http://{options.listen_host}:{options.metrics_port}/metrics"
        " (and /healthz, /readyz: ready while acting)",
        flush=True,
    )
    if options.leader_election:
        print(
            f"  election : acts while holding lease {options.own_namespace}/"
            f"{options.leader_election_lease}",
            flush=True,
        )
    if options.secure:
        print("  security : TLS and authentication on in every namespace's cluster", flush=True)
        if options.cert_manager is None:
            issuing = "a CA the operator runs in each namespace"
        else:
            issuer = options.cert_manager.issuer
            issuing = f"cert-manager, {issuer or 'a CA of each namespace (Issuer/capstan-ca)'}"
        print(f"  certificates : from {issuing}", flush=True)
    else:
        print(
            "  security : OFF (--insecure): the clusters' ports are plaintext and open to"
            " anyone who reaches them",
            flush=True,
        )
    election = (
        LeaderElection(
            CoordinationLease(
                KubeRest.from_api_client(api),
                options.own_namespace,
                options.leader_election_lease,
            ),
            identity(),
        )
        if options.leader_election
        else None
    )
    return asyncio.run(_serve(registry, options, metrics, kube, election))


async def _mark_acting(kube: KubeObjects, options: OperatorOptions, acting: bool) -> None:
    """Label this replica's pod as acting or standing by (the webhook Service selects the
    acting one); nothing outside a pod."""
    pod = os.environ.get("POD_NAME")
    if pod and options.own_namespace:
        value = "true" if acting else "false"
        await kube.label_pod(options.own_namespace, pod, {ACTING_LABEL: value})


async def _serve(
    registry: kopf.OperatorRegistry,
    options: OperatorOptions,
    metrics: OperatorMetrics,
    kube: KubeObjects,
    election: LeaderElection | None,
) -> int:
    """Serve /metrics, /healthz and /readyz; stand by until this replica leads (with an
    election), then run Kopf until a signal or the loss of the Lease. The exit code: 0
    stopped, 3 the Lease lost."""

    def acting() -> bool:
        return election is None or election.leading

    metrics.leader.set_function(lambda: 1.0 if acting() else 0.0)
    loop = asyncio.get_running_loop()
    endpoints = HttpEndpoints(
        options.listen_host, options.metrics_port, metrics.registry, lambda: True, acting, loop
    )
    endpoints.start()
    stopping = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)  # Kopf takes them over once it runs
    lost = asyncio.Event()
    keeper: asyncio.Task[None] | None = None
    try:
        if election is not None:
            await _mark_acting(kube, options, False)  # a restarted container stands by
            if not await election.wait_to_lead(stopping):
                return 0
            keeper = asyncio.create_task(election.keep(lost))
            await _mark_acting(kube, options, True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await kopf.operator(
            registry=registry,
            clusterwide=options.all_namespaces,
            namespaces=list(options.namespaces),
            liveness_endpoint=f"http://{options.listen_host}:{options.liveness_port}/healthz",
            standalone=True,
            stop_flag=lost,
        )
    finally:
        # A keeper whose Lease was lost stays: should the cleanup below hang on the API
        # server, it still ends the process before the Lease could lapse.
        if keeper is not None and not lost.is_set():
            keeper.cancel()
        if election is not None:
            with contextlib.suppress(Exception):  # the pod may be going; the label with it
                await _mark_acting(kube, options, False)
            if not lost.is_set():
                await election.resign()
        endpoints.stop()
    return 3 if lost.is_set() else 0
