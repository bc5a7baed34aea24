"""A broker serving TLS: plaintext and a wrong CA refused, the SDK, the CLI and the
official client served, and the certificate rotated under steady sends without a failed
send."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capstan.client.message import Message
from capstan.client.producer.producer import Producer
from capstan.security.local_ca import LocalCa, create_ca
from tests.broker.broker_process import BrokerProcess
from tests.cli.test_broker_cli import capstan
from tests.security.certificates import HOSTS, tls_settings
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, LocalCa]]:
    root = tmp_path_factory.mktemp("tls")
    tls, ca = tls_settings(root, "broker")
    broker = BrokerProcess(root, ca=ca.certificate, tls={**tls, "metrics": True})
    broker.start()
    try:
        broker.create_topic("Secure", queues=2)
        yield broker, ca
    finally:
        broker.stop()


def health(channel: grpc.Channel) -> grpc.StatusCode:
    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def served_serial(address: str, ca: Path) -> int:
    """The serial number of the certificate a new TLS connection to `address` is shown."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_plaintext_and_a_wrong_ca_are_refused(tls_broker, tmp_path: Path):
    broker, ca = tls_broker
    assert health(grpc.insecure_channel(broker.address)) == grpc.StatusCode.UNAVAILABLE
    other = create_ca(tmp_path / "other", name="Someone else's CA")
    wrong = grpc.ssl_channel_credentials(root_certificates=other.certificate.read_bytes())
    assert health(grpc.secure_channel(broker.address, wrong)) == grpc.StatusCode.UNAVAILABLE
    right = grpc.ssl_channel_credentials(root_certificates=ca.certificate.read_bytes())
    assert health(grpc.secure_channel(broker.address, right)) == grpc.StatusCode.OK


def test_the_metrics_port_serves_https_only_with_the_same_certificate(tls_broker):
    broker, ca = tls_broker
    context = ssl.create_default_context(cafile=str(ca.certificate))
    url = f"https://127.0.0.1:{broker.http_port}"
    with urllib.request.urlopen(f"{url}/metrics", timeout=10, context=context) as reply:
        assert reply.status == 200 and b"rocketmq_" in reply.read()
    with urllib.request.urlopen(f"{url}/readyz", timeout=10, context=context) as reply:
        assert reply.status == 200
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{broker.http_port}/metrics", timeout=10)


def test_the_sdk_and_the_cli_send_over_tls(tls_broker):
    broker, ca = tls_broker
    with Producer(broker.address, ca_file=str(ca.certificate)) as producer:
        receipt = producer.send(Message("Secure", b"over tls"))
    assert receipt.message_id
    sent = capstan("produce", "Secure", "--body", "cli", "--server", broker.address,
                   "--ca", str(ca.certificate), "--json")  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["messages"][0]["message_id"]
    plain = capstan("topic", "list", "--server", broker.address)
    assert plain.returncode != 0


OFFICIAL_SEND = """
from rocketmq import ClientConfiguration, Credentials, Message, Producer
producer = Producer(ClientConfiguration({address!r}, Credentials(), request_timeout=5),
                    ("Secure",), tls_enable=True)
producer.startup()
m = Message(); m.topic = "Secure"; m.body = b"official over tls"
print(producer.send(m).message_id)
producer.shutdown()
"""


def test_the_official_client_sends_over_tls_trusting_the_ca(tls_broker):
    broker, ca = tls_broker
    env = {
        **os.environ,
        "PYTHONSAFEPATH": "1",
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(ca.certificate),
    }
    done = subprocess.run(
        [sys.executable, "-c", OFFICIAL_SEND.format(address=broker.address)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()


def test_a_certificate_rotated_under_steady_sends_fails_no_send(tls_broker):
    broker, ca = tls_broker
    certs = Path(broker.root) / "certs"
    before = served_serial(broker.address, ca.certificate)
    failures: list[str] = []
    sent = 0
    stop = threading.Event()

    def steady() -> None:
        nonlocal sent
        # A new producer now and then: its connection handshakes again, on whatever
        # certificate the broker serves by then.
        while not stop.is_set():
            with Producer(broker.address, ca_file=str(ca.certificate)) as producer:
                for _ in range(20):
                    try:
                        producer.send(Message("Secure", b"steady"))
                        sent += 1
                    except Exception as exc:  # noqa: BLE001 - every failure is the finding
                        failures.append(repr(exc))

    sender = threading.Thread(target=steady)
    sender.start()
    try:
        wait_until(lambda: sent >= 50, 30, "sends before the rotation")
        rotated = ca.issue(certs, "broker", HOSTS)
        new_serial = x509.load_pem_x509_certificate(rotated.certificate.read_bytes()).serial_number
        assert new_serial != before
        wait_until(
            lambda: served_serial(broker.address, ca.certificate) == new_serial,
            10,
            "new connections to get the new certificate",
        )
        at_rotation = sent
        wait_until(lambda: sent >= at_rotation + 50, 30, "sends after the rotation")
    finally:
        stop.set()
        sender.join(60)
    assert failures == []
    assert "serving a new TLS certificate" in broker.log.read_text()
