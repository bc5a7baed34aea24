"""`capstan broker --config FILE` (one broker in the foreground) and `capstan up` (a local
cluster: commands/local_cluster.py)."""

from __future__ import annotations

import argparse
import pathlib
import sys

import yaml

from capstan.common.errors import CapstanError


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    broker = commands.add_parser("broker", help="run one broker (foreground until SIGTERM)")
    broker.add_argument("--config", default=None, help="YAML file; see docs/broker.md")
    broker.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one setting of the file, e.g. --set store.flush_mode=ASYNC_FLUSH "
        "(repeatable)",
    )
    broker.set_defaults(run=run_broker)

    up = commands.add_parser(
        "up",
        help="the embedded default: a local controller and broker group(s), until Ctrl-C",
    )
    up.add_argument("--port", type=int, default=8081, help="first broker's gRPC port (8081)")
    up.add_argument("--http-port", type=int, default=9100, help="first metrics port (9100)")
    up.add_argument(
        "--controller-port",
        type=int,
        default=9876,
        help="controller gRPC, the clients' access point (9876)",
    )
    up.add_argument("--data-dir", default="capstan-data", help="default ./capstan-data")
    up.add_argument("--groups", type=int, default=1, help="broker groups (default 1)")
    up.add_argument(
        "--replicas", type=int, default=2, help="brokers per group, master included (default 2)"
    )
    up.add_argument("--config", default=None, help="optional broker YAML for other settings")
    up.add_argument(
        "--secure",
        action="store_true",
        help="TLS on every port and authentication with ACLs on: a local CA "
        "(<data-dir>/tls/ca.crt) and a super user (<data-dir>/admin-credentials.json)",
    )
    up.set_defaults(run=run_up)


def run_broker(args: argparse.Namespace) -> int:
    from capstan.common.broker_settings import load_broker_settings

    try:
        path = pathlib.Path(args.config) if args.config else None
        settings = load_broker_settings(path, args.set)
    except CapstanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _serve(settings)


def run_up(args: argparse.Namespace) -> int:
    from capstan.commands.local_cluster import LocalCluster, LocalClusterPlan
    from capstan.common.broker_settings import load_broker_settings

    if not 1 <= args.groups <= 26 or not 1 <= args.replicas <= 9:
        print("error: --groups must be within 1..26 and --replicas within 1..9", file=sys.stderr)
        return 2
    base: dict[str, object] = {}
    if args.config:
        try:
            load_broker_settings(pathlib.Path(args.config))  # checked here, used by each broker
            base = yaml.safe_load(pathlib.Path(args.config).read_text()) or {}
        except (CapstanError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    secure = None
    if args.secure:
        from capstan.commands.local_security import prepare

        secure = prepare(pathlib.Path(args.data_dir))
    plan = LocalClusterPlan(
        data_dir=pathlib.Path(args.data_dir),
        port=args.port,
        http_port=args.http_port,
        controller_port=args.controller_port,
        groups=args.groups,
        replicas=args.replicas,
        broker_settings=base,
        secure=secure,
    )
    return LocalCluster(plan).run()


def _serve(settings: object) -> int:
    from capstan.broker.server import BrokerServer
    from capstan.common.broker_settings import BrokerSettings
    from capstan.common.lifecycle import run_in_foreground

    assert isinstance(settings, BrokerSettings)
    server = BrokerServer(settings)

    def announce(s: BrokerServer) -> None:
        host = settings.advertised_host or (
            "127.0.0.1" if settings.listen_host in ("0.0.0.0", "") else settings.listen_host
        )
        print(f"Capstan broker {settings.broker_name} is ready", flush=True)
        print(f"  RocketMQ 5 gRPC endpoint : {host}:{s.grpc_port}", flush=True)
        if s.http_port:
            scheme = "https" if settings.tls.metrics else "http"
            print(
                f"  metrics                  : {scheme}://{host}:{s.http_port}/metrics", flush=True
            )
        print(f"  data                     : {settings.data_path.resolve()}", flush=True)
        print(f"  try: capstan topic create Demo --server {host}:{s.grpc_port}", flush=True)
        print("Stop with Ctrl-C.", flush=True)

    return run_in_foreground(server, announce)
