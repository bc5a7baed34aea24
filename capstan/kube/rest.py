"""A small JSON client of the Kubernetes API server, for the few objects Capstan's processes
read and write outside the operator (the controller's ConfigMap and Leases).

The official Kubernetes client builds a model class for every kind the API has, and loading
them costs a process about a CPU-second at start. A controller that restarts beside its
brokers (a node back from a power cut) would spend that before it listens, so the
controller talks to the API server over urllib3 with plain dictionaries, as `kubectl get -o
json` prints them. The official client is still what reads a kubeconfig
(`from_configuration`), outside a cluster, where its start-up cost does not matter.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import urllib3

from capstan.common.errors import CapstanError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where the kubelet mounts a pod's service account token and the cluster's CA."""
TOKEN_REREAD_S = 60.0
"""How often the service account token is read again: the kubelet rotates a projected
token well before it expires (an hour by default), and a client must follow it."""
DEFAULT_TIMEOUT_S = 10.0


class KubeStatusError(CapstanError):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{status} {reason}" + (f": {message}" if message else ""))


class KubeUnreachable(CapstanError):
    """No answer from the API server: refused, reset, timed out or a TLS failure."""

    retriable = True


class ServiceAccountToken:
    """The pod's token as a bearer credential, read again every TOKEN_REREAD_S."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self._path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._token = ""
        self._read_at = float("-inf")

    def __call__(self) -> str:
        with self._lock:
            now = self._clock()
            if now - self._read_at >= TOKEN_REREAD_S:
                self._token = self._path.read_text().strip()
                self._read_at = now
            return f"Bearer {self._token}"


class KubeRest:
    """JSON requests to the API server at `host` (https://address:port, or http:// for a
    test server); `authorization` gives each request's Authorization header, or None."""

    def __init__(
        self,
        host: str,
        *,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        verify: bool = True,
        server_name: str | None = None,
        authorization: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.host = host.rstrip("/")
        self._authorization = authorization
        tls: dict[str, Any] = {}
        if self.host.startswith("https://"):
            tls = {
                "cert_reqs": "CERT_REQUIRED" if verify else "CERT_NONE",
                "ca_certs": ca_file,
                "cert_file": cert_file,
                "key_file": key_file,
            }
            if server_name:
                tls["server_hostname"] = server_name
        self._http = urllib3.PoolManager(maxsize=4, retries=False, **tls)

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> dict[str, Any]:
        """The object the API server answers `method path` with (`body` sent as JSON);
        KubeStatusError for an error status, KubeUnreachable for no answer."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        credential = self._authorization()
        if credential:
            headers["Authorization"] = credential
        try:
            response = self._http.request(
                method,
                self.host + path,
                body=None if body is None else json.dumps(body).encode(),
                headers=headers,
                timeout=urllib3.Timeout(total=timeout_s),
                redirect=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise KubeUnreachable(f"{method} {path}: {exc}") from exc
        answer = _json_or_none(response.data)
        if response.status >= 400:
            status = answer if isinstance(answer, dict) else {}
            raise KubeStatusError(
                response.status,
                str(status.get("reason") or response.reason or ""),
                str(status.get("message") or ""),
            )
        if not isinstance(answer, dict):
            raise KubeStatusError(
                response.status, "NotAnObject", f"{method} {path} answered no JSON object"
            )
        return answer

    def close(self) -> None:
        self._http.clear()

    @classmethod
    def in_cluster(
        cls,
        environ: Mapping[str, str] = os.environ,
        account_dir: Path = SERVICE_ACCOUNT_DIR,
    ) -> KubeRest | None:
        """The API server as a pod reaches it, with its service account; None outside a
        pod (no KUBERNETES_SERVICE_HOST, or no token mounted)."""
        address = environ.get("KUBERNETES_SERVICE_HOST")
        port = environ.get("KUBERNETES_SERVICE_PORT")
        token = account_dir / "token"
        if not address or not port or not token.is_file():
            return None
        if ":" in address:  # an IPv6 address
            address = f"[{address}]"
        ca = account_dir / "ca.crt"
        return cls(
            f"https://{address}:{port}",
            ca_file=str(ca) if ca.is_file() else None,
            authorization=ServiceAccountToken(token),
        )

    @classmethod
    def from_configuration(cls, configuration: Any) -> KubeRest:
        """The API server a `kubernetes.client.Configuration` names, with its credentials
        (its token asked for at each request, so a kubeconfig's refresh hook still runs)."""

        def authorization() -> str | None:
            credential = configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
            return str(credential) if credential else None

        return cls(
            configuration.host,
            ca_file=configuration.ssl_ca_cert,
            cert_file=configuration.cert_file,
            key_file=configuration.key_file,
            verify=bool(configuration.verify_ssl),
            server_name=getattr(configuration, "tls_server_name", None),
            authorization=authorization,
        )

    @classmethod
    def from_api_client(cls, api_client: Any) -> KubeRest:
        """The API server a `kubernetes.client.ApiClient` talks to, as it does."""
        return cls.from_configuration(api_client.configuration)

    @classmethod
    def from_kubeconfig(cls, path: str | None = None) -> KubeRest:
        """The API server of the kubeconfig at `path` (else KUBECONFIG, else
        ~/.kube/config), read with the official client."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            # KUBECONFIG as it is now: the library reads it once, when it is first imported.
            config_file=path or os.environ.get("KUBECONFIG") or None,
            client_configuration=configuration,
        )
        return cls.from_configuration(configuration)


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None
