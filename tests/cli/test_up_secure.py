"""`capstan up --secure`: a local CA, TLS on every port, authentication and ACLs on, and
the admin user's keys in the data dir; the CLI and the official client use them, and a
caller without them is refused."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_broker_cli import capstan
from tests.cli.up_process import UpProcess


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    up = UpProcess(tmp_path_factory.mktemp("secure-up") / "data", secure=True).start()
    try:
        yield up
    finally:
        up.stop()


def env_of(up: UpProcess, signed: bool = True, tls: bool = True) -> dict[str, str]:
    """The environment the banner's `export` lines make (signed: the admin's keys file)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPSTAN_")}
    if signed:
        env["CAPSTAN_CREDENTIALS"] = str((up.data_dir / "admin-credentials.json").resolve())
    if tls:
        env["CAPSTAN_CA"] = str(up.data_dir / "tls" / "ca.crt")
    return env


def test_the_banner_names_the_ca_and_the_credentials_and_secrets_are_private(secured):
    out = secured.output()
    assert f"CA         : {(secured.data_dir / 'tls' / 'ca.crt').resolve()}" in out
    assert "authentication on, super user" in out and "open for local development" not in out
    keys_file = (secured.data_dir / "admin-credentials.json").resolve()
    assert f"export CAPSTAN_CREDENTIALS={keys_file}" in out
    keys = json.loads((secured.data_dir / "admin-credentials.json").read_text())
    assert keys["access_key"] == "admin" and len(keys["secret_key"]) >= 32
    assert keys["secret_key"] not in out
    for private in ("admin-credentials.json", "cluster-secret", "tls/ca.key", "tls/node.key"):
        assert (secured.data_dir / private).stat().st_mode & 0o077 == 0, private
    # The metrics ports are TLS ports too, under the same CA.
    assert "metrics https://127.0.0.1:" in out
    context = ssl.create_default_context(cafile=str(secured.data_dir / "tls" / "ca.crt"))
    url = f"https://127.0.0.1:{secured.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10, context=context) as reply:
        assert reply.status == 200 and b"rocketmq_" in reply.read()


def test_the_cli_with_the_admin_keys_and_the_ca_works_and_without_them_is_refused(secured):
    server = ["--server", secured.access_point]
    env = env_of(secured)
    for command in (
        ["topic", "create", "Demo", "--queues", "2"],
        ["group", "create", "Readers"],
        ["produce", "Demo", "--body", "hello"],
    ):
        done = capstan(*command, *server, env=env)
        assert done.returncode == 0, done.stderr
    got = capstan(
        "consume", "Demo", "--group", "Readers", "--count", "1", *server, "--json", env=env
    )
    assert got.returncode == 0, got.stderr
    assert [m["body"] for m in json.loads(got.stdout)["messages"]] == ["hello"]
    unsigned = capstan("topic", "list", *server, env=env_of(secured, signed=False))
    assert unsigned.returncode != 0 and "not signed" in unsigned.stderr
    plaintext = capstan("topic", "list", *server, env=env_of(secured, tls=False))
    assert plaintext.returncode != 0 and "a TLS port?" in plaintext.stderr


OFFICIAL = """
import json, sys
from rocketmq import ClientConfiguration, Credentials, Message, Producer
keys = json.load(open(sys.argv[2]))
config = ClientConfiguration(sys.argv[1], Credentials(keys["access_key"], keys["secret_key"]))
producer = Producer(config, ("Official",), tls_enable=True)
producer.startup()
m = Message(); m.topic = "Official"; m.body = b"signed, over tls"
print(producer.send(m).message_id)
producer.shutdown()
"""


def test_the_official_client_with_the_admin_keys_sends(secured):
    created = capstan("topic", "create", "Official", "--server", secured.access_point,
                      env=env_of(secured))  # fmt: skip
    assert created.returncode == 0, created.stderr
    # The official client trusts gRPC's default roots; this file replaces them.
    roots = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(secured.data_dir / "tls" / "ca.crt")}
    env = {**os.environ, "PYTHONSAFEPATH": "1", **roots}
    credentials = str(secured.data_dir / "admin-credentials.json")
    done = subprocess.run(
        [sys.executable, "-c", OFFICIAL, secured.access_point, credentials],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()


def test_a_second_secure_up_keeps_the_same_keys(tmp_path: Path):
    from capstan.commands.local_security import prepare

    first = prepare(tmp_path)
    keys = first.admin_credentials.read_text()
    ca = first.ca.read_bytes()
    second = prepare(tmp_path)
    assert second.admin_credentials.read_text() == keys and second.ca.read_bytes() == ca
