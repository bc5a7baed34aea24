"""`capstan operator` refuses, in one line, credentials that do not reach an API server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def operator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "capstan.cli", "operator", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_no_kubeconfig_is_one_line(tmp_path: Path) -> None:
    done = operator("--all-namespaces", "--kubeconfig", str(tmp_path / "missing"))
    assert done.returncode == 2
    assert done.stderr.startswith("error: no Kubernetes credentials")
    assert len(done.stderr.strip().splitlines()) == 1


def test_an_api_server_nobody_answers_at_is_named_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG)
    done = operator("--namespace", "capstan", "--kubeconfig", str(config))
    assert done.returncode == 2
    assert done.stderr.startswith("error: cannot reach the API server at https://127.0.0.1:1")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_namespace_or_all_is_required() -> None:
    done = operator()
    assert done.returncode == 2
    assert "--namespace" in done.stderr


def test_a_webhook_service_that_is_not_namespace_slash_name_is_refused(tmp_path: Path) -> None:
    cert = tmp_path / "tls.crt"
    cert.write_text("x")
    done = operator(
        *("--namespace", "capstan", "--webhook-port", "9443"),
        *("--webhook-cert", str(cert), "--webhook-key", str(cert)),
        *("--webhook-service", "capstan-operator:443"),
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: --webhook-service 'capstan-operator:443': expected NAMESPACE/NAME[:PORT]"
    )


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (
            ["--cert-manager-issuer", "ClusterIssuer/corp"],
            "error: --cert-manager-issuer needs --cert-issuer cert-manager",
        ),
        (
            ["--cert-issuer", "cert-manager", "--insecure"],
            "error: --cert-issuer cert-manager and --insecure exclude each other",
        ),
        (
            ["--cert-issuer", "cert-manager", "--cert-manager-issuer", "Vault/corp"],
            "error: --cert-manager-issuer: the cert-manager issuer 'Vault/corp' is not"
            " Issuer/<name> or ClusterIssuer/<name>",
        ),
    ],
)
def test_a_wrong_certificate_issuer_choice_is_refused_naming_the_flags(
    flags: list[str], said: str
) -> None:
    done = operator("--namespace", "capstan", *flags)
    assert done.returncode == 2
    assert done.stderr.strip() == said
