"""A call passed on for a client carries the client's address, vouched for with the
cluster's secret (capstan/security/peers.py); a claim without that proof is refused, and a
client cannot smuggle one through a replica."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from capstan.common.security_settings import TlsSettings
from capstan.security import peers
from capstan.security.peers import (
    FORWARDED_FOR,
    FORWARDED_PROOF,
    ForgedForwarding,
    forwarded_source,
    passed_on_behalf,
    source_address,
)
from capstan.security.signature import Credentials, signed_metadata

SECRET = "the-cluster-secret-for-forwarding"


class _Call:
    """What a servicer's context tells of an incoming call: its peer and its metadata."""

    def __init__(self, peer: str, metadata: list[tuple[str, str]]) -> None:
        self._peer = peer
        self._metadata = metadata

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self._metadata


@pytest.fixture
def as_cluster(tmp_path: Path) -> Any:
    secret_file = tmp_path / "cluster-secret"
    secret_file.write_text(SECRET)
    yield peers.configure(TlsSettings(), str(secret_file))
    peers.configure(TlsSettings())


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:10.0.0.7:5123", "10.0.0.7"),
        ("ipv6:[fd00::1]:5123", "fd00::1"),
        ("unix:/run/capstan.sock", None),
    ],
)
def test_the_source_address_of_a_peer(peer: str, address: str | None) -> None:
    assert source_address(peer) == address


def test_a_passed_on_call_names_the_client_and_the_proof_holds(as_cluster: Any) -> None:
    client = signed_metadata(Credentials("app", "app-secret"))
    # A client's own forwarded-for entries never get through.
    smuggled = [(FORWARDED_FOR, "10.1.1.1"), (FORWARDED_PROOF, "f" * 64)]
    passed = passed_on_behalf(_Call("ipv4:198.18.3.4:40000", [*client, *smuggled]))
    assert [v for k, v in passed if k == FORWARDED_FOR] == ["198.18.3.4"]
    assert forwarded_source(passed, SECRET) == "198.18.3.4"
    assert forwarded_source(client, SECRET) is None  # a call nobody passed on
    with pytest.raises(ForgedForwarding, match="without the cluster's proof"):
        forwarded_source(passed, "another-clusters-secret")
    with pytest.raises(ForgedForwarding):
        forwarded_source([*client, *smuggled], SECRET)


def test_the_proof_binds_the_address_to_the_calls_signed_time(as_cluster: Any) -> None:
    client = signed_metadata(Credentials("app", "app-secret"))
    passed = passed_on_behalf(_Call("ipv4:198.18.3.4:40000", client))
    other_address = [(k, "198.18.3.5" if k == FORWARDED_FOR else v) for k, v in passed]
    with pytest.raises(ForgedForwarding):
        forwarded_source(other_address, SECRET)
    other_time = [(k, "20200101T000000Z" if k == "x-mq-date-time" else v) for k, v in passed]
    with pytest.raises(ForgedForwarding):
        forwarded_source(other_time, SECRET)


def test_without_the_clusters_identity_nothing_is_vouched_for() -> None:
    peers.configure(TlsSettings())
    client = signed_metadata(Credentials("app", "app-secret"))
    passed = passed_on_behalf(_Call("ipv4:198.18.3.4:40000", client))
    assert not any(k in (FORWARDED_FOR, FORWARDED_PROOF) for k, _ in passed)
