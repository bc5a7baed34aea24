"""`capstan broker` and `capstan controller` that cannot start say why in one line: a busy
port, an address that is not this machine's, a store another broker holds, a bad config
file; and a server whose start failed lets go of what it had opened."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from capstan.broker.server import BrokerServer
from capstan.common.broker_settings import BrokerSettings
from capstan.common.errors import StoreLockedError
from capstan.common.lifecycle import serve_until_signalled
from capstan.common.listen import ListenError, probe
from tests.broker.broker_process import BrokerProcess, free_port
from tests.cli.one_line import the_error_line
from tests.cli.test_broker_cli import capstan
from tests.controller.controller_process import ControllerProcess

UNASSIGNABLE = "10.255.255.1"  # not an address of this machine: binding it fails at once


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another process listens on (this test's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def write(path: Path, settings: dict[str, object]) -> str:
    path.write_text(yaml.safe_dump(settings))
    return str(path)


def broker_config(tmp_path: Path, **overrides: object) -> str:
    settings = {"listen_host": "127.0.0.1", "grpc_port": free_port(), "http_port": free_port()}
    settings["data_dir"] = str(tmp_path / "data")
    return write(tmp_path / "broker.yaml", settings | overrides)


def controller_config(tmp_path: Path, **overrides: object) -> str:
    settings = {"listen_host": "127.0.0.1", "grpc_port": free_port(), "http_port": free_port()}
    settings["state"] = {"directory": str(tmp_path / "state")}
    return write(tmp_path / "controller.yaml", settings | overrides)


CONFIGS = {"broker": broker_config, "controller": controller_config}


@pytest.mark.parametrize("command", ["broker", "controller"])
def test_a_busy_grpc_port_is_named(tmp_path: Path, busy_port: int, command: str):
    config = CONFIGS[command](tmp_path, grpc_port=busy_port)
    result = capstan(command, "--config", config)
    the_error_line(result, f"gRPC port {busy_port} on 127.0.0.1 is already in use")


def test_a_second_controller_on_the_same_port_does_not_share_it(tmp_path: Path):
    """gRPC's default SO_REUSEPORT let a second controller bind the first one's port and
    take some of its connections."""
    first = ControllerProcess(tmp_path / "first", tmp_path / "state").start()
    try:
        config = controller_config(tmp_path, grpc_port=first.port)
        result = capstan("controller", "--config", config)
        the_error_line(result, f"gRPC port {first.port} on 127.0.0.1 is already in use")
    finally:
        first.stop()


@pytest.mark.parametrize("command", ["broker", "controller"])
def test_a_busy_http_port_is_named(tmp_path: Path, busy_port: int, command: str):
    config = CONFIGS[command](tmp_path, http_port=busy_port)
    result = capstan(command, "--config", config)
    the_error_line(result, f"HTTP port {busy_port} on 127.0.0.1 is already in use")


@pytest.mark.parametrize("command", ["broker", "controller"])
def test_an_address_of_another_machine_is_named(tmp_path: Path, command: str):
    config = CONFIGS[command](tmp_path, listen_host=UNASSIGNABLE)
    result = capstan(command, "--config", config)
    the_error_line(result, f"cannot listen on {UNASSIGNABLE}", "not an address of this machine")


def test_a_second_broker_on_the_same_store_names_the_first(tmp_path: Path):
    (tmp_path / "first").mkdir()
    first = BrokerProcess(tmp_path / "first").start()
    try:
        assert first.proc is not None
        config = broker_config(tmp_path, data_dir=str(tmp_path / "first" / "data"))
        result = capstan("broker", "--config", config)
        the_error_line(result, "already open in another process", f"pid {first.proc.pid}")
        assert first.proc.poll() is None  # the first one is untouched
    finally:
        first.stop()


@pytest.mark.parametrize("command", ["broker", "controller"])
@pytest.mark.parametrize(
    ("text", "cause"),
    [
        (None, "cannot read"),
        ("grpc_port: [\n", "not valid YAML at line 2, column 1"),
        ("grpc_prot: 1\n", "unknown setting grpc_prot"),
        ("grpc_port: eighty\n", "grpc_port: expected a number, got 'eighty'"),
    ],
    ids=["missing", "bad-yaml", "unknown-key", "wrong-type"],
)
def test_a_bad_config_file_is_one_line(tmp_path: Path, command: str, text: str | None, cause: str):
    config = tmp_path / "config.yaml"
    if text is not None:
        config.write_text(text)
    result = capstan(command, "--config", str(config))
    the_error_line(result, cause)


def test_a_broker_that_cannot_start_lets_go_of_its_ports(tmp_path: Path):
    """The store is locked, found after both ports were bound: they are free again, and no
    server is left for the garbage collector to shut down on a closed event loop (that
    warning would fail this test)."""
    (tmp_path / "holder").mkdir()
    holder = BrokerProcess(tmp_path / "holder").start()
    try:
        settings = BrokerSettings(
            listen_host="127.0.0.1",
            grpc_port=free_port(),
            http_port=free_port(),
            data_dir=str(tmp_path / "holder" / "data"),
        )
        with pytest.raises(StoreLockedError):
            asyncio.run(serve_until_signalled(BrokerServer(settings)))
        assert probe("127.0.0.1", settings.grpc_port) is None
        assert probe("127.0.0.1", settings.http_port) is None
    finally:
        holder.stop()


def test_a_busy_port_in_process_is_a_listen_error(tmp_path: Path, busy_port: int):
    settings = BrokerSettings(
        listen_host="127.0.0.1",
        grpc_port=free_port(),
        http_port=busy_port,
        data_dir=str(tmp_path / "data"),
    )
    with pytest.raises(ListenError, match=f"HTTP port {busy_port}"):
        asyncio.run(serve_until_signalled(BrokerServer(settings)))
    assert probe("127.0.0.1", settings.grpc_port) is None
