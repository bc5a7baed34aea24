"""Reaching `--server`: the option every networked command has, its retries, and the one
line a command prints when what answers there is not the service it needs.

Every command's default is the controller's address, the access point of `capstan up`:
it answers QueryRoute and capstan.v1.Admin for every broker group. A broker's own address
works too (a standalone `capstan broker` has no controller), except for `capstan cluster`.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from capstan.client.admin import BlockingAdminClient, BlockingControllerClient
from capstan.client.errors import ClientError, from_admin_rpc_error
from capstan.commands.output import CommandError
from capstan.commands.probe import (
    Probe,
    Transport,
    describe,
    listed_services,
    probe_transport,
)
from capstan.common.errors import ConfigError
from capstan.common.grpc_services import ADMIN, CONTROLLER, MESSAGING
from capstan.security.credentials import (
    ACCESS_KEY_ENV,
    CA_ENV,
    CREDENTIALS_ENV,
    SECRET_KEY_ENV,
    credentials_from,
)
from capstan.security.signature import Credentials

DEFAULT_SERVER = "127.0.0.1:9876"

STARTING_WINDOW_S = 3.0
"""How long a command keeps trying an address where nothing listens (yet): a server that
is starting, in seconds."""

ANSWERING_WINDOW_S = 10.0
"""How long a command keeps retrying a gRPC server that answers UNAVAILABLE (a broker
still recovering its store, a slave whose master is gone), in seconds."""

RETRY_PAUSE_S = 0.2

CALL_TIMEOUT_S = 10.0
"""Each call's deadline, in seconds."""

# What grpc itself answers for a service or method the server has not registered.
_GRPC_METHOD_NOT_FOUND = "Method not found!"


T = TypeVar("T")


@dataclass(frozen=True)
class Need:
    """What a command needs at `--server`: a gRPC service, and who serves it, in the words
    a user knows."""

    command: str
    service: str
    server: str
    hint: str = ""

    @property
    def who(self) -> str:
        return f"{self.server} ({self.hint})" if self.hint else self.server


def admin_need(command: str) -> Need:
    return Need(command, ADMIN, "a Capstan controller or broker")


def messaging_need(command: str) -> Need:
    return Need(command, MESSAGING, "a Capstan controller or broker")


def controller_need(command: str) -> Need:
    return Need(
        command, CONTROLLER, "the controller", f"capstan controller, default {DEFAULT_SERVER}"
    )


def add_server(parser: argparse.ArgumentParser, where: str) -> None:
    """`--server` and the keys that sign its calls; `where` says what to name there and
    what each kind of address does."""
    parser.add_argument(
        "--server",
        default=DEFAULT_SERVER,
        metavar="HOST:PORT",
        help=f"{where} (default {DEFAULT_SERVER}, the controller `capstan up` starts)",
    )
    parser.add_argument(
        "--access-key",
        default=None,
        help=f"sign every call as this user (default ${ACCESS_KEY_ENV}; none: unsigned)",
    )
    parser.add_argument(
        "--secret-key", default=None, help=f"the user's secret key (default ${SECRET_KEY_ENV})"
    )
    parser.add_argument(
        "--credentials",
        default=None,
        metavar="FILE",
        help='sign as the user of this JSON file, {"access_key": ..., "secret_key": ...} '
        f"(default ${CREDENTIALS_ENV} when no keys are given)",
    )
    parser.add_argument(
        "--ca",
        default=None,
        metavar="PEM",
        help=f"TLS, trusting this CA certificate (default ${CA_ENV}; none: plaintext)",
    )


def ca_file(args: argparse.Namespace) -> str | None:
    """The CA `--ca` or CAPSTAN_CA names: TLS to `--server`; None: plaintext."""
    return args.ca or os.environ.get(CA_ENV) or None


def credentials(args: argparse.Namespace) -> Credentials | None:
    """The keys `--access-key`/`--secret-key`, `--credentials` or the environment give;
    None for none."""
    try:
        return credentials_from(args.access_key, args.secret_key, credentials_file=args.credentials)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None


def split_address(server: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT) as (host, port); a CommandError when it is not one."""
    host, sep, port = server.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(f"--server {server!r}: expected HOST:PORT, e.g. {DEFAULT_SERVER}")
    return host, int(port)


def services_at(server: str) -> frozenset[str] | None:
    """The services `server` lists through reflection; None when it cannot say."""
    split_address(server)
    with grpc.insecure_channel(server) as channel:
        return listed_services(channel)


def call(server: str, need: Need, run: Callable[[], T]) -> T:
    """`run()`, a call to `server`, retried while the server may be starting; any failure
    becomes a CommandError that says what was reached, if it was not `need`."""
    host, port = split_address(server)
    started = time.monotonic()
    while True:
        try:
            return run()
        except ClientError as exc:
            failure = exc
        except grpc.RpcError as exc:
            failure = from_admin_rpc_error(exc)
        waited_s = time.monotonic() - started
        _raise_unless_retrying(failure, server, need, (host, port), waited_s)
        time.sleep(RETRY_PAUSE_S)


def call_admin(
    args: argparse.Namespace,
    need: Need,
    run: Callable[[BlockingAdminClient], T],
    server: str | None = None,
) -> T:
    """`run` with an admin client of `server` (default `--server`), signed as the
    command's keys say, as `call` does it."""
    address = server or args.server
    with BlockingAdminClient(
        address,
        timeout_s=CALL_TIMEOUT_S,
        retry_s=0,
        credentials=credentials(args),
        ca_file=ca_file(args),
    ) as admin:
        return call(address, need, lambda: run(admin))


def call_controller(
    args: argparse.Namespace, need: Need, run: Callable[[BlockingControllerClient], T]
) -> T:
    """`run` with a controller client of `--server`, as `call_admin` does it."""
    with BlockingControllerClient(
        args.server,
        timeout_s=CALL_TIMEOUT_S,
        retry_s=0,
        credentials=credentials(args),
        ca_file=ca_file(args),
    ) as controller:
        return call(args.server, need, lambda: run(controller))


def _raise_unless_retrying(
    exc: ClientError,
    server: str,
    need: Need,
    address: tuple[str, int],
    waited_s: float,
) -> None:
    if exc.code == "UNIMPLEMENTED":
        raise CommandError(_unimplemented(exc, server, need))
    if exc.code != "UNAVAILABLE":
        raise CommandError(exc.detail)
    probe = probe_transport(*address)
    if probe.transport is Transport.GRPC:
        if waited_s < ANSWERING_WINDOW_S:
            return
        raise CommandError(f"{server}: {exc.detail}")
    if probe.transport is Transport.NOTHING and waited_s < STARTING_WINDOW_S:
        return
    raise CommandError(not_grpc(server, probe, need))


def _unimplemented(exc: ClientError, server: str, need: Need) -> str:
    detail = exc.detail
    services = services_at(server)
    if services is None:
        if detail != _GRPC_METHOD_NOT_FOUND:
            return detail  # the servicer's own refusal
        reached = f"a gRPC server that does not serve {need.service}"
    elif need.service in services:
        return detail
    else:
        reached = describe(services)
    return f"{server} is {reached}; '{need.command}' needs {need.who}"


def not_grpc(server: str, probe: Probe, need: Need) -> str:
    """The line for an address where no gRPC server answers."""
    wanted = f"'{need.command}' needs {need.who}"
    match probe.transport:
        case Transport.NOTHING:
            return (
                f"cannot reach {server} ({probe.detail.lower()}): is {need.server} running there?"
            )
        case Transport.UNKNOWN_HOST:
            return f"cannot reach {server}: {probe.detail}"
        case Transport.HTTP1:
            return f"{server} answers {probe.detail} (a metrics port?), not gRPC; {wanted}"
        case Transport.TLS:
            return f"{server} speaks TLS; the capstan CLI speaks plaintext gRPC"
        case _:
            return f"{server} does not speak gRPC ({probe.detail}); {wanted}"
