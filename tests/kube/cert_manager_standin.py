"""A stand-in for cert-manager (https://cert-manager.io) on the test control plane: its
three CRDs (Certificate, Issuer, ClusterIssuer of cert-manager.io/v1, schemas left open)
and an issuing loop in a thread.

cert-manager itself cannot run here: it ships only as images from registries this machine
cannot reach. The stand-in does the part of its contract Capstan relies on, as cert-manager
documents it: a Certificate whose Secret is missing, or was issued for another spec, is
issued into `spec.secretName` as a `kubernetes.io/tls` Secret with `tls.crt`, `tls.key` and
`ca.crt` (the issuing CA), labelled from `spec.secretTemplate`; its `Ready` condition says
whether it is issued, and why not. Issuers: `selfSigned` (for a Certificate with `isCA`)
and `ca` (signs with the CA in `spec.ca.secretName`; a ClusterIssuer's secret is in
`cert-manager`, cert-manager's default cluster resource namespace). Renewal, ACME, keystores
and the rest of cert-manager are not stood in for.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import logging
import re
import threading
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from capstan.security.local_ca import PemPair, issue_pem, new_ca_pem
from tests.kube.control_plane import ControlPlane
from tests.tiers import process_tool

log = logging.getLogger(__name__)

GROUP, VERSION = "cert-manager.io", "v1"
CLUSTER_RESOURCE_NAMESPACE = "cert-manager"
SPEC_DIGEST = "standin.capstan.io/spec-digest"
"""The stand-in's mark on a Secret: the digest of the Certificate spec it was issued for."""


def crds() -> list[dict[str, Any]]:
    def crd(kind: str, plural: str, scope: str) -> dict[str, Any]:
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{GROUP}"},
            "spec": {
                "group": GROUP,
                "scope": scope,
                "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                "versions": [
                    {
                        "name": VERSION,
                        "served": True,
                        "storage": True,
                        "subresources": {"status": {}},
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }

    return [
        crd("Certificate", "certificates", "Namespaced"),
        crd("Issuer", "issuers", "Namespaced"),
        crd("ClusterIssuer", "clusterissuers", "Cluster"),
    ]


def install_crds(plane: ControlPlane) -> None:
    """The CRDs, applied and served (waits for the API server to establish them)."""
    for crd in crds():
        done = plane.kubectl("apply", "-f", "-", stdin=json.dumps(crd))
        assert done.returncode == 0, done.stderr
    for crd in crds():
        done = plane.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd['metadata']['name']}"
        )
        assert done.returncode == 0, done.stderr


def _days(duration: str, default: int) -> int:
    """Days of a Go duration in hours ("2160h"), which is how Capstan writes them."""
    found = re.fullmatch(r"(\d+)h", duration or "")
    return max(1, int(found.group(1)) // 24) if found else default


@process_tool
class CertManagerStandIn:
    """Issues the Certificates of `namespace` every `interval_s`, in a thread."""

    def __init__(self, plane: ControlPlane, namespace: str, interval_s: float = 0.5) -> None:
        self._api = plane.api()
        self._custom = client.CustomObjectsApi(self._api)
        self._core = client.CoreV1Api(self._api)
        self._namespace = namespace
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cert-manager-standin", daemon=True)
        self.issued: list[str] = []
        """The Certificates issued, in order (a name once per issuance)."""

    def __enter__(self) -> CertManagerStandIn:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._api.close()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                found = self._custom.list_namespaced_custom_object(
                    GROUP, VERSION, self._namespace, "certificates"
                )
            except ApiException as exc:
                log.warning("listing Certificates failed: %s", exc.reason)
                continue
            for certificate in found.get("items", []):
                try:
                    self._reconcile(certificate)
                except ApiException as exc:
                    log.warning("Certificate %s: %s", certificate["metadata"]["name"], exc.reason)

    def _reconcile(self, certificate: dict[str, Any]) -> None:
        name = certificate["metadata"]["name"]
        spec = certificate.get("spec") or {}
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
        secret = self._secret(self._namespace, spec.get("secretName", ""))
        if secret is not None and (secret.metadata.annotations or {}).get(SPEC_DIGEST) == digest:
            return
        try:
            pair, ca = self._issue(spec)
        except LookupError as exc:
            self._set_ready(name, False, "IssuerNotReady", str(exc))
            return
        data = {"tls.crt": pair.certificate, "tls.key": pair.key, "ca.crt": ca}
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {
                "name": spec["secretName"],
                "namespace": self._namespace,
                "labels": dict((spec.get("secretTemplate") or {}).get("labels") or {}),
                "annotations": {
                    "cert-manager.io/certificate-name": name,
                    "cert-manager.io/issuer-name": spec["issuerRef"]["name"],
                    "cert-manager.io/issuer-kind": spec["issuerRef"].get("kind", "Issuer"),
                    SPEC_DIGEST: digest,
                },
            },
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        if secret is None:
            self._core.create_namespaced_secret(self._namespace, body)
        else:
            self._core.replace_namespaced_secret(spec["secretName"], self._namespace, body)
        self.issued.append(name)
        self._set_ready(name, True, "Issued", "Certificate is up to date and has not expired")

    def _issue(self, spec: dict[str, Any]) -> tuple[PemPair, bytes]:
        """The pair for `spec` and the CA that signed it; LookupError naming what is missing."""
        ref = spec.get("issuerRef") or {}
        kind, issuer_name = ref.get("kind", "Issuer"), ref.get("name", "")
        try:
            if kind == "ClusterIssuer":
                issuer = self._custom.get_cluster_custom_object(
                    GROUP, VERSION, "clusterissuers", issuer_name
                )
                secrets_namespace = CLUSTER_RESOURCE_NAMESPACE
            else:
                issuer = self._custom.get_namespaced_custom_object(
                    GROUP, VERSION, self._namespace, "issuers", issuer_name
                )
                secrets_namespace = self._namespace
        except ApiException as exc:
            if exc.status == 404:
                raise LookupError(f'{kind} "{issuer_name}" not found') from None
            raise
        issuer_spec = issuer.get("spec") or {}
        days = _days(spec.get("duration", ""), 90)
        now = datetime.datetime.now(datetime.UTC)
        if "selfSigned" in issuer_spec:
            if not spec.get("isCA"):
                raise LookupError("the stand-in self-signs CA certificates only")
            pair = new_ca_pem(spec.get("commonName", "self-signed"), days, now)
            return pair, pair.certificate
        ca_secret_name = (issuer_spec.get("ca") or {}).get("secretName", "")
        ca_secret = self._secret(secrets_namespace, ca_secret_name)
        data = (ca_secret.data or {}) if ca_secret is not None else {}
        if "tls.crt" not in data or "tls.key" not in data:
            raise LookupError(
                f'{kind} "{issuer_name}": the CA Secret {secrets_namespace}/{ca_secret_name}'
                " is not there yet"
            )
        ca = PemPair(base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"]))
        hosts = [*(spec.get("dnsNames") or []), *(spec.get("ipAddresses") or [])]
        pair = issue_pem(ca, spec.get("commonName", hosts[0] if hosts else "x"), hosts, days, now)
        return pair, ca.certificate

    def _secret(self, namespace: str, name: str) -> Any:
        if not name:
            return None
        try:
            return self._core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _set_ready(self, name: str, ready: bool, reason: str, message: str) -> None:
        condition = {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": reason,
            "message": message,
        }
        self._custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            self._namespace,
            "certificates",
            name,
            {"status": {"conditions": [condition]}},
        )
