"""`capstan operator --cert-issuer cert-manager` on the real control plane, with the
cert-manager stand-in (tests/kube/cert_manager_standin.py: cert-manager ships only as
images this machine cannot pull): the operator says cert-manager is missing until its
CRDs come, then asks it for the namespace's CA and every server's certificate, and trusts a
replaced CA until it expires."""

from __future__ import annotations

from pathlib import Path

import pytest

from capstan.operator import cluster_security
from capstan.security.local_ca import read_certificate, signed_by
from tests.kube.cert_manager_standin import CertManagerStandIn, install_crds
from tests.kube.control_plane import ControlPlane
from tests.operator.test_operator_on_the_api_server import (
    Operator,
    broker_group,
    running_operator,
    secret_data,
)

pytestmark = pytest.mark.slow


def bundle_of(operator: Operator) -> bytes:
    found = operator.get("configmap", "capstan-ca-bundle") or {}
    return str((found.get("data") or {}).get("ca.crt", "")).encode()


def certificates_in(bundle: bytes) -> set[bytes]:
    end = b"-----END CERTIFICATE-----\n"
    return {part + end for part in bundle.split(end) if part.strip()}


def test_certificates_come_from_cert_manager_once_it_is_installed(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    with running_operator(control_plane, tmp_path, "--cert-issuer", "cert-manager") as operator:
        group = broker_group("orders", replicas=2, min_in_sync=1)
        group["spec"]["tls"] = {"alternativeNames": ["198.18.0.7"]}
        made = operator.apply(group)
        assert made.returncode == 0, made.stderr

        # Without cert-manager's CRDs: the group's status says so, and nothing is made.
        def degraded_for_want_of_cert_manager() -> bool:
            status = (operator.get("brokergroup", "orders") or {}).get("status") or {}
            return any(
                c["type"] == "Degraded"
                and c["status"] == "True"
                and c["reason"] == "CertManagerMissing"
                and "cert-manager is not installed" in c["message"]
                for c in status.get("conditions") or []
            )

        operator.wait(degraded_for_want_of_cert_manager, 60, "Degraded: CertManagerMissing")
        assert operator.get("statefulset", "orders") is None

        install_crds(control_plane)
        with CertManagerStandIn(control_plane, operator.namespace) as cert_manager:
            secrets = ["capstan-cert-manager-ca", "capstan-controller-tls", "orders-tls"]
            operator.wait(
                lambda: (
                    all(secret_data(operator, s).get("tls.crt") for s in secrets)
                    and operator.get("statefulset", "orders") is not None
                    and bundle_of(operator) != b""
                ),
                150,
                f"{secrets} issued and the group's StatefulSet made",
            )
            for issuer in ("capstan-selfsigned", "capstan-ca"):
                assert operator.get("issuer.cert-manager.io", issuer) is not None
            ca = secret_data(operator, "capstan-cert-manager-ca")["tls.crt"]
            assert bundle_of(operator) == ca
            orders = secret_data(operator, "orders-tls")["tls.crt"]
            assert signed_by(orders, ca)
            assert signed_by(secret_data(operator, "capstan-controller-tls")["tls.crt"], ca)
            hosts = read_certificate(orders).hosts
            assert f"*.orders-brokers.{operator.namespace}.svc" in hosts and "198.18.0.7" in hosts
            wanted = (operator.get("certificate.cert-manager.io", "orders-tls") or {})["spec"]
            assert wanted["issuerRef"] == {
                "group": "cert-manager.io",
                "kind": "Issuer",
                "name": "capstan-ca",
            }
            assert wanted["ipAddresses"] == ["198.18.0.7"]
            assert (wanted["duration"], wanted["renewBefore"]) == ("2160h", "720h")
            # cert-manager issues; the operator's own CA is not made, its keys still are.
            assert operator.get("secret", "capstan-ca") is None
            assert secret_data(operator, "capstan-cluster").get("cluster-secret")
            assert secret_data(operator, "capstan-admin").get("secret-key")

            # cert-manager replaces the CA, and then the group's certificate: the bundle
            # the pods trust holds both CAs, so peers on either are not refused.
            assert operator.kubectl("delete", "secret", "capstan-cert-manager-ca").returncode == 0
            operator.wait(
                lambda: (
                    secret_data(operator, "capstan-cert-manager-ca").get("tls.crt")
                    not in (None, ca)
                ),
                30,
                "the CA issued again",
            )
            new_ca = secret_data(operator, "capstan-cert-manager-ca")["tls.crt"]
            assert operator.kubectl("delete", "secret", "orders-tls").returncode == 0
            operator.wait(
                lambda: signed_by(secret_data(operator, "orders-tls").get("tls.crt") or ca, new_ca),
                30,
                "the group's certificate issued again by the new CA",
            )
            operator.wait(
                lambda: certificates_in(bundle_of(operator)) == {ca, new_ca},
                cluster_security.RENEW_INTERVAL_S * 2 + 30,
                "the trust bundle holding the old CA and the new",
            )
            assert cert_manager.issued.count("capstan-cert-manager-ca") == 2
        log = operator.log.read_text()
        assert "PRIVATE KEY" not in log
