"""`capstan controller --config FILE`: run one controller replica in the foreground."""

from __future__ import annotations

import argparse
import pathlib
import sys

from capstan.common.errors import CapstanError


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    controller = commands.add_parser(
        "controller", help="run one controller replica (foreground until SIGTERM)"
    )
    controller.add_argument(
        "--config", default=None, help="YAML file; see docs/controller.md (default: defaults)"
    )
    controller.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one setting, e.g. --set state.backend=kubernetes (repeatable)",
    )
    controller.set_defaults(run=run_controller)


def run_controller(args: argparse.Namespace) -> int:
    from capstan.common.lifecycle import run_in_foreground
    from capstan.controller.server import ControllerServer
    from capstan.controller.settings import load_controller_settings

    try:
        path = pathlib.Path(args.config) if args.config else None
        settings = load_controller_settings(path, args.set)
        server = ControllerServer(settings)
    except (CapstanError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def announce(s: ControllerServer) -> None:
        host = "127.0.0.1" if settings.listen_host in ("0.0.0.0", "") else settings.listen_host
        print(f"Capstan controller {s.controller_id} is up", flush=True)
        print(f"  capstan.v1.Controller : {host}:{s.grpc_port}", flush=True)
        if s.http_port:
            scheme = "https" if settings.tls.metrics else "http"
            print(f"  metrics               : {scheme}://{host}:{s.http_port}/metrics", flush=True)
        print(f"  state                 : {settings.state.backend}", flush=True)
        print("Stop with Ctrl-C.", flush=True)

    return run_in_foreground(server, announce)
