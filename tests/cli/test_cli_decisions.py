"""The CLI's pure decisions: what an address's first bytes say it is, which addresses it
accepts, and which command lines are children of `capstan up` (where a message goes is the
SDK's: tests/client/test_routing_decisions.py)."""

from __future__ import annotations

import pytest

from capstan.commands.local_preflight import child_config
from capstan.commands.output import CommandError
from capstan.commands.probe import Transport, classify, describe
from capstan.commands.reach import split_address
from capstan.common.grpc_services import BROKER_SERVICES, CONTROLLER_SERVICES, REFLECTION


@pytest.mark.parametrize(
    ("first", "transport", "detail"),
    [
        (b"HTTP/1.0 404 Not Found\r\nServer: BaseHTTP", Transport.HTTP1, "HTTP/1.0"),
        (b"HTTP/1.1 200 OK\r\n", Transport.HTTP1, "HTTP/1.1"),
        (b"\x00\x00\x18\x04\x00\x00\x00\x00\x00\x00\x04", Transport.GRPC, ""),
        (b"\x15\x03\x01\x00\x02\x02\x46", Transport.TLS, ""),
        (
            b"",
            Transport.OTHER,
            "it closed the connection without a word: a TLS port? give its CA with --ca "
            "or CAPSTAN_CA",
        ),
        (b"SSH-2.0-OpenSSH_9.2\r\n", Transport.OTHER, "it answered b'SSH-2.0-OpenSSH_'"),
    ],
)
def test_the_first_bytes_tell_what_answers(first, transport, detail):
    probe = classify(first)
    assert (probe.transport, probe.detail) == (transport, detail)


def test_servers_are_told_apart_by_the_services_they_list():
    assert describe([*CONTROLLER_SERVICES, REFLECTION]) == "a Capstan controller"
    assert describe([*BROKER_SERVICES, REFLECTION]) == "a Capstan broker"
    assert describe(["acme.Orders", REFLECTION, "grpc.health.v1.Health"]) == (
        "a gRPC server serving acme.Orders"
    )


@pytest.mark.parametrize(
    ("server", "expected"),
    [("127.0.0.1:9876", ("127.0.0.1", 9876)), ("[::1]:81", ("::1", 81)), ("h.x:1", ("h.x", 1))],
)
def test_addresses_are_host_and_port(server, expected):
    assert split_address(server) == expected


@pytest.mark.parametrize("server", ["localhost", ":9876", "h:", "h:x", "h:0", "h:70000"])
def test_other_addresses_are_refused(server):
    with pytest.raises(CommandError, match="expected HOST:PORT"):
        split_address(server)


PY = "/x/.venv/bin/python"


@pytest.mark.parametrize(
    ("argv", "config"),
    [
        ([PY, "-m", "capstan.cli", "broker", "--config", "d/b-1.yaml", ""], "d/b-1.yaml"),
        ([PY, "-m", "capstan.cli", "controller", "--config", "/d/c.yaml"], "/d/c.yaml"),
        ([PY, "-m", "capstan.cli", "up", "--config", "/d/broker.yaml"], None),
        ([PY, "-m", "capstan.cli", "broker", "--set", "grpc_port=1"], None),
        ([PY, "-m", "capstan.cli", "broker", "--config"], None),
        ([PY, "-c", "capstan.cli", "broker", "--config", "/d/b.yaml"], None),
        ([""], None),
        ([], None),
    ],
)  # fmt: skip
def test_a_child_of_capstan_up_is_known_by_its_command_line(argv, config):
    assert child_config(argv) == config
