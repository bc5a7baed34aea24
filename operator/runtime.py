"""`capstan operator`: the Kopf runtime with Capstan's handlers, liveness and metrics.

Before Kopf starts, the operator checks that it can reach the API server with the
credentials it was given (in-cluster service account, `--kubeconfig`, or $KUBECONFIG), so a
wrong address or token ends in one line instead of an endless retry. Kopf then watches the
namespaces it is told to (or all of them), serves its liveness endpoint
(`/healthz` on `--liveness-port`), and the operator's metrics are on `--metrics-port`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import kopf
import urllib3
from kubernetes import client, config
from prometheus_client import start_http_server

from capstan.operator.metrics import OperatorMetrics

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


def build_registry(metrics: OperatorMetrics) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60

    return registry


def run_operator(options: OperatorOptions) -> int:
    api = load_credentials(options.kubeconfig)
    version = server_version(api)
    metrics = OperatorMetrics()
    start_http_server(options.metrics_port, options.listen_host, registry=metrics.registry)
    registry = build_registry(metrics)
    where = "all namespaces" if options.all_namespaces else ", ".join(options.namespaces)
    print(f"Capstan operator is up: Kubernetes {version}, watching {where}", flush=True)
    print(
        f"  liveness : http://{options.listen_host}:{options.liveness_port}/healthz",
        flush=True,
    )
    print(f"  metrics  : http://{options.listen_host}:{options.metrics_port}/metrics", flush=True)
    asyncio.run(
        kopf.operator(
            registry=registry,
            clusterwide=options.all_namespaces,
            namespaces=list(options.namespaces),
            liveness_endpoint=f"http://{options.listen_host}:{options.liveness_port}/healthz",
            standalone=True,
        )
    )
    return 0
