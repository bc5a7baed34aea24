"""An API server that enforces the CRDs' CEL rules: etcd and apiextensions-apiserver 1.36
(built by scripts/cel_server.sh) on free 127.0.0.1 ports.

The control plane's kube-apiserver 1.20 (control_plane.py) drops `x-kubernetes-validations`,
so there the operator's webhook stands in for the rules; this server runs them itself,
transition rules (`oldSelf`) included. It serves CustomResourceDefinitions and custom objects
and nothing else: no namespaces (an object may name any), pods, RBAC or webhooks, and no
discovery for kubectl, so it is spoken to in plain HTTPS. Clients present a certificate of
the system:masters group, signed by a CA made for each server.

    with CelServer(tmp_path) as server:
        server.apply_crd(Path("crds/topic.yaml"))
        status, message = server.create("topics", topic)   # (422, "... readQueues must ...")
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import shutil
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

import yaml

from tests.broker.broker_process import free_port
from tests.kube.processes import spawn, spawn_etcd, stop_all
from tests.tiers import process_tool

GROUP_VERSION = "capstan.io/v1alpha1"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
START_S = 60.0
ESTABLISHED_S = 30.0
REQUEST_TIMEOUT_S = 10.0
_DISABLED_ADMISSION = (
    # Namespaces do not exist on this server: with NamespaceLifecycle on, every write fails
    # "not yet ready to handle request". The others would call webhooks or policies it lacks.
    "NamespaceLifecycle",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionWebhook",
)


def binary() -> Path:
    """Where scripts/cel_server.sh caches the server."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "capstan" / "apiextensions-apiserver-1.36" / "apiextensions-apiserver"


class Answer(NamedTuple):
    """The server's answer to a write: the HTTP status and, for a refusal, its Status
    message (empty for a success)."""

    status: int
    message: str


@process_tool
@dataclass
class CelServer:
    """etcd and apiextensions-apiserver in `root` (their data, certificates and logs)."""

    root: Path
    port: int = 0
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _tls: ssl.SSLContext | None = None

    def __enter__(self) -> CelServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> CelServer:
        """Start etcd and the server and wait until it serves; stops both if it cannot."""
        server = binary()
        if not server.exists() or shutil.which("etcd") is None:
            raise RuntimeError(
                f"the CEL server is not built ({server if not server.exists() else 'etcd'} "
                "missing): run `bash scripts/cel_server.sh`"
            )
        try:
            self._make_certificates()
            etcd_url = self._start_etcd()
            self._start_server(server, etcd_url)
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server, then etcd; SIGKILL what does not end within 15 s."""
        stop_all(list(self._procs.values()))
        self._procs.clear()
        self._tls = None  # a restart makes a new server certificate

    def apply_crd(self, path: Path) -> None:
        """Create (or replace) the CRD in the YAML file and wait until its resource is
        served; RuntimeError with the server's message if it refuses the CRD."""
        crd = yaml.safe_load(path.read_text())
        name = crd["metadata"]["name"]
        answer = self._write("POST", CRD_PATH, crd)
        if answer.status == http.client.CONFLICT:
            current = self.get(f"{CRD_PATH}/{name}")
            crd["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            answer = self._write("PUT", f"{CRD_PATH}/{name}", crd)
        if not 200 <= answer.status < 300:
            raise RuntimeError(f"the server refused {path.name}: {answer.status} {answer.message}")
        self._wait_established(name, crd["spec"]["names"]["plural"])

    def create(self, plural: str, obj: dict[str, Any]) -> Answer:
        """POST a custom object of capstan.io/v1alpha1 into its metadata.namespace."""
        return self._write("POST", self._objects_path(plural, obj), obj)

    def replace(self, plural: str, obj: dict[str, Any]) -> Answer:
        """PUT a custom object over the stored one; without a metadata.resourceVersion, the
        stored object's is taken (the server refuses an update without one)."""
        obj = copy.deepcopy(obj)
        path = f"{self._objects_path(plural, obj)}/{obj['metadata']['name']}"
        if "resourceVersion" not in obj["metadata"]:
            stored = self.get(path)
            obj["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
        return self._write("PUT", path, obj)

    def get(self, path: str) -> dict[str, Any]:
        """GET an API path; RuntimeError unless the server answers 200."""
        status, body = self._request("GET", path)
        if status != http.client.OK:
            raise RuntimeError(f"GET {path}: {status} {body.get('message', body)}")
        return body

    def _objects_path(self, plural: str, obj: dict[str, Any]) -> str:
        namespace = obj["metadata"].get("namespace") or "default"
        return f"/apis/{GROUP_VERSION}/namespaces/{namespace}/{plural}"

    def _write(self, method: str, path: str, obj: dict[str, Any]) -> Answer:
        status, body = self._request(method, path, obj)
        return Answer(status, "" if 200 <= status < 300 else str(body.get("message", body)))

    def _request(
        self, method: str, path: str, obj: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S, context=self._client_tls()
        )
        try:
            payload = None if obj is None else json.dumps(obj).encode()
            headers = {"Accept": "application/json", "Content-Type": "application/json"}
            connection.request(method, path, body=payload, headers=headers)
            reply = connection.getresponse()
            text = reply.read().decode(errors="replace")
        finally:
            connection.close()
        try:
            body = json.loads(text)
        except ValueError:
            body = {"message": text}
        return reply.status, body if isinstance(body, dict) else {"message": text}

    def _client_tls(self) -> ssl.SSLContext:
        """Trusts the server's own self-signed certificate, which it writes when it starts."""
        if self._tls is None:
            context = ssl.create_default_context(cafile=str(self.root / "certs" / "apiserver.crt"))
            context.load_cert_chain(self.root / "client.crt", self.root / "client.key")
            self._tls = context
        return self._tls

    def _make_certificates(self) -> None:
        (self.root / "certs").mkdir(parents=True, exist_ok=True)
        self._openssl(
            "req -x509 -newkey rsa:2048 -nodes -days 2 -keyout ca.key -out ca.crt"
            " -subj /CN=capstan-cel-test-ca"
        )
        self._openssl(
            "req -newkey rsa:2048 -nodes -keyout client.key -out client.csr"
            " -subj /O=system:masters/CN=admin"
        )
        self._openssl(
            "x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2"
            " -out client.crt"
        )

    def _openssl(self, command: str) -> None:
        """Run openssl in `root` with a command of words without spaces."""
        subprocess.run(
            ["openssl", *command.split()], cwd=self.root, check=True, capture_output=True
        )

    def _start_etcd(self) -> str:
        self._procs["etcd"], client_url = spawn_etcd(self.root)
        return client_url

    def _start_server(self, server: Path, etcd_url: str) -> None:
        # The server asks for kubeconfigs of a cluster behind it (for delegated authn/z and
        # its informers); one naming a closed port keeps it from looking for in-cluster config.
        nowhere = self.root / "nowhere.kubeconfig"
        nowhere.write_text(
            "apiVersion: v1\nkind: Config\n"
            "clusters: [{name: none, cluster: {server: 'http://127.0.0.1:1'}}]\n"
            "users: [{name: none, user: {}}]\n"
            "contexts: [{name: none, context: {cluster: none, user: none}}]\n"
            "current-context: none\n"
        )
        self.port = free_port()
        self._spawn(
            "apiextensions-apiserver",
            [
                str(server),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--cert-dir={self.root / 'certs'}",
                f"--client-ca-file={self.root / 'ca.crt'}",
                "--authentication-skip-lookup",
                f"--authentication-kubeconfig={nowhere}",
                f"--authorization-kubeconfig={nowhere}",
                f"--kubeconfig={nowhere}",
                f"--disable-admission-plugins={','.join(_DISABLED_ADMISSION)}",
                "--enable-priority-and-fairness=false",
            ],
        )

    def _spawn(self, name: str, argv: list[str]) -> None:
        self._procs[name] = spawn(self.root, name, argv)

    def _wait_healthy(self) -> None:
        """Until /healthz answers 200 (/readyz never does: the server's informer of core
        Services has no core API to sync from)."""
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited: {self._log_tail(name)}")
            if (self.root / "certs" / "apiserver.crt").exists():
                try:
                    if self._request("GET", "/healthz")[0] == http.client.OK:
                        return
                except OSError:
                    pass
            time.sleep(0.2)
        raise RuntimeError(
            f"the CEL server is not healthy within {START_S:.0f} s: {self._log_tail()}"
        )

    def _wait_established(self, name: str, plural: str) -> None:
        deadline = time.monotonic() + ESTABLISHED_S
        while time.monotonic() < deadline:
            status = self.get(f"{CRD_PATH}/{name}").get("status") or {}
            conditions = status.get("conditions") or []  # null until the controller writes
            state = {c["type"]: c for c in conditions}
            if state.get("NamesAccepted", {}).get("status") == "False":
                raise RuntimeError(f"{name}: names not accepted: {state['NamesAccepted']}")
            established = state.get("Established", {}).get("status") == "True"
            if established and self._request("GET", f"/apis/{GROUP_VERSION}/{plural}")[0] == 200:
                return
            time.sleep(0.1)
        raise RuntimeError(f"{name} not established within {ESTABLISHED_S:.0f} s")

    def _log_tail(self, name: str = "apiextensions-apiserver") -> str:
        path = self.root / f"{name}.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return " | ".join(lines[-5:])
