"""`capstan operator`: run the Kubernetes operator in the foreground (until SIGTERM)."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import Any


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    operator = commands.add_parser(
        "operator", help="run the Kubernetes operator (foreground until SIGTERM)"
    )
    where = operator.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--namespace", action="append", default=[], help="a namespace to watch (repeatable)"
    )
    where.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    operator.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: the pod's service account, else $KUBECONFIG)",
    )
    operator.add_argument("--listen-host", default="0.0.0.0")
    operator.add_argument("--liveness-port", type=int, default=8080)
    operator.add_argument("--metrics-port", type=int, default=9090)
    operator.add_argument(
        "--image", default="capstan:0.1.0", help="image of the controller pods (capstan:0.1.0)"
    )
    operator.add_argument(
        "--spark-image",
        default="capstan-spark:0.1.0",
        help="image of the scheduled compaction and audit jobs (capstan-spark:0.1.0)",
    )
    operator.add_argument(
        "--controller-replicas",
        type=int,
        default=1,
        help="controller pods per namespace (1; more wait on the leader Lease)",
    )
    operator.add_argument(
        "--controller-template",
        default=None,
        metavar="JSON",
        help="the controller pods' template, as a BrokerGroup's spec.template takes it "
        '(e.g. \'{"pod": {"tolerations": [...]}}\'; docs/operator.md, Pod template)',
    )
    operator.add_argument(
        "--webhook-port",
        type=int,
        default=None,
        help="serve the validating webhook (HTTPS) on this port; needs --webhook-cert/-key",
    )
    operator.add_argument(
        "--webhook-host",
        default=None,
        help="host name or address the API server calls the webhook at (default: listen host)",
    )
    operator.add_argument(
        "--webhook-service",
        default=None,
        metavar="NAMESPACE/NAME[:PORT]",
        help="the API server calls the webhook through this Service (port 443 by default) "
        "instead of at --webhook-host; the certificate must name NAME.NAMESPACE.svc",
    )
    operator.add_argument("--webhook-cert", default=None, help="PEM certificate for that host")
    operator.add_argument("--webhook-key", default=None, help="PEM key of the certificate")
    operator.add_argument(
        "--webhook-ca",
        default=None,
        help="PEM CA bundle the API server verifies the certificate with (default: the "
        "certificate itself, self-signed)",
    )
    operator.add_argument(
        "--webhook-configuration",
        default="capstan.io",
        metavar="NAME",
        help="the webhook configurations (validating and mutating) the operator keeps pointing "
        "at itself, made when absent (default: capstan.io; the chart makes one per release)",
    )
    operator.add_argument(
        "--insecure",
        action="store_true",
        help="run the clusters with plaintext ports and no authentication (local development "
        "only; by default the operator makes a CA, certificates and a cluster secret in each "
        "namespace and turns TLS and authentication on)",
    )
    operator.add_argument(
        "--cert-issuer",
        choices=("operator", "cert-manager"),
        default="operator",
        help="who issues the brokers' and controllers' certificates: a CA the operator runs "
        "in each namespace (default), or cert-manager, whose CRDs must be installed",
    )
    operator.add_argument(
        "--cert-manager-issuer",
        default="",
        metavar="KIND/NAME",
        help="with --cert-issuer cert-manager: the issuer that signs them, Issuer/<name> (in "
        "each namespace) or ClusterIssuer/<name>; default: a CA of each namespace's own, "
        "which cert-manager makes (Issuer/capstan-ca)",
    )
    operator.add_argument(
        "--own-namespace",
        default=os.environ.get("POD_NAMESPACE", ""),
        help="the namespace of the operator's pod, which the NetworkPolicies it makes admit "
        "(default $POD_NAMESPACE; the chart sets it)",
    )
    operator.add_argument(
        "--leader-election",
        action="store_true",
        help="act only while holding the Lease capstan-operator in --own-namespace; other "
        "replicas stand by and take over when it lapses or is given up (the chart sets it)",
    )
    operator.add_argument(
        "--leader-election-lease",
        default="capstan-operator",
        metavar="NAME",
        help="the Lease of --leader-election (capstan-operator; the chart names it after "
        "the release, so two releases in one namespace elect apart)",
    )
    operator.add_argument(
        "--work-dir",
        default=None,
        help="where the operator keeps its own files, such as each namespace's CA bundle "
        "(default: $TMPDIR/capstan-operator)",
    )
    operator.set_defaults(run=run_operator_command)


def run_operator_command(args: argparse.Namespace) -> int:
    from capstan.operator.runtime import ClusterUnreachable, OperatorOptions, run_operator
    from capstan.operator.webhook import ServiceRef, WebhookOptions

    hook = None
    if args.webhook_port is not None:
        if not (args.webhook_cert and args.webhook_key):
            print("error: --webhook-port needs --webhook-cert and --webhook-key", file=sys.stderr)
            return 2
        files = [f for f in (args.webhook_cert, args.webhook_key, args.webhook_ca) if f]
        missing = [f for f in files if not pathlib.Path(f).is_file()]
        if missing:
            print(f"error: no such file: {missing[0]}", file=sys.stderr)
            return 2
        try:
            service = ServiceRef.parse(args.webhook_service) if args.webhook_service else None
        except ValueError as exc:
            print(f"error: --webhook-service {exc}", file=sys.stderr)
            return 2
        hook = WebhookOptions(
            port=args.webhook_port,
            host=args.webhook_host or args.listen_host,
            certfile=pathlib.Path(args.webhook_cert),
            keyfile=pathlib.Path(args.webhook_key),
            cafile=pathlib.Path(args.webhook_ca) if args.webhook_ca else None,
            service=service,
            configuration=args.webhook_configuration,
        )

    if args.leader_election and not args.own_namespace:
        print(
            "error: --leader-election needs --own-namespace (or $POD_NAMESPACE): where the "
            "Lease is",
            file=sys.stderr,
        )
        return 2
    try:
        cert_manager = _certificate_issuing(args)
        controller_template = _controller_template(args.controller_template)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    options = OperatorOptions(
        namespaces=tuple(args.namespace),
        all_namespaces=args.all_namespaces,
        kubeconfig=args.kubeconfig,
        listen_host=args.listen_host,
        liveness_port=args.liveness_port,
        metrics_port=args.metrics_port,
        image=args.image,
        controller_replicas=args.controller_replicas,
        spark_image=args.spark_image,
        webhook=hook,
        secure=not args.insecure,
        own_namespace=args.own_namespace,
        cert_manager=cert_manager,
        controller_template=controller_template,
        leader_election=args.leader_election,
        leader_election_lease=args.leader_election_lease,
        **({"work_dir": pathlib.Path(args.work_dir)} if args.work_dir else {}),
    )
    try:
        return run_operator(options)
    except ClusterUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a busy metrics or liveness port
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _controller_template(text: str | None) -> dict[str, Any] | None:
    """--controller-template's JSON, checked as a BrokerGroup's template is."""
    if not text:
        return None
    from capstan.operator.resource_rules import pod_template_errors

    try:
        template = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--controller-template is not JSON: {exc}") from None
    errors = pod_template_errors(template, "--controller-template", "controller")
    if errors:
        raise ValueError("; ".join(str(e) for e in errors))
    return dict(template)


def _certificate_issuing(args: argparse.Namespace) -> Any:
    """The operator's cert-manager choice (a CertManagerIssuing), None for its own CA;
    ValueError naming the flags for a wrong combination."""
    from capstan.common.errors import ConfigError
    from capstan.operator.cert_manager import IssuerRef
    from capstan.operator.cluster_security import CertManagerIssuing

    if args.cert_issuer != "cert-manager":
        if args.cert_manager_issuer:
            raise ValueError("--cert-manager-issuer needs --cert-issuer cert-manager")
        return None
    if args.insecure:
        raise ValueError("--cert-issuer cert-manager and --insecure exclude each other")
    if not args.cert_manager_issuer:
        return CertManagerIssuing()
    try:
        return CertManagerIssuing(IssuerRef.parse(args.cert_manager_issuer))
    except ConfigError as exc:
        raise ValueError(f"--cert-manager-issuer: {exc}") from None
