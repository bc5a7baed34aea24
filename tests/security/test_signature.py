"""The request signature, checked against what the official client signs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from rocketmq import ClientConfiguration, Credentials
from rocketmq.v5.util.signature import Signature

from capstan.security.signature import (
    AUTHORIZATION,
    DATE_TIME,
    AuthenticationError,
    Failure,
    signed_metadata,
    verify,
)
from capstan.security.signature import Credentials as OurCredentials

SECRETS = {"alice": "alice-secret", "bob": "bob-secret"}


def official(ak: str, sk: str) -> list[tuple[str, str]]:
    config = ClientConfiguration("127.0.0.1:8081", Credentials(ak, sk))
    return Signature.metadata(config, "client-1")


def now_for(metadata: list[tuple[str, str]]) -> datetime:
    stamp = dict(metadata)[DATE_TIME]
    return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)


def failure_of(metadata: list[tuple[str, str]], now: datetime | None = None) -> Failure:
    with pytest.raises(AuthenticationError) as caught:
        verify(metadata, SECRETS.get, now or datetime.now(UTC))
    assert "secret" not in caught.value.detail or "secret key of" in caught.value.detail
    for secret in SECRETS.values():
        assert secret not in caught.value.detail
    return caught.value.failure


def test_what_the_official_client_signs_is_verified_as_its_access_key():
    metadata = official("alice", "alice-secret")
    assert verify(metadata, SECRETS.get, now_for(metadata)) == "alice"


def test_our_signature_is_the_official_clients():
    at = datetime(2026, 11, 26, 10, 15, 0, tzinfo=UTC)
    ours = dict(signed_metadata(OurCredentials("bob", "bob-secret"), at))
    assert ours[DATE_TIME] == "20261126T101500Z"
    theirs = Signature.sign("bob-secret", "20261126T101500Z")
    assert ours[AUTHORIZATION] == (
        f"MQv2-HMAC-SHA1 Credential=bob, SignedHeaders=x-mq-date-time, Signature={theirs}"
    )
    assert verify(list(ours.items()), SECRETS.get, at) == "bob"


def test_a_wrong_secret_an_unknown_key_and_no_signature_are_each_named():
    assert failure_of(official("alice", "not-her-secret")) is Failure.WRONG_SIGNATURE
    assert failure_of(official("mallory", "whatever")) is Failure.UNKNOWN_USER
    assert failure_of(official("", "")) is Failure.MISSING
    assert failure_of([(DATE_TIME, "20261126T101500Z")]) is Failure.MISSING


def test_a_signature_older_or_newer_than_the_allowed_skew_is_expired():
    metadata = official("alice", "alice-secret")
    signed = now_for(metadata)
    assert verify(metadata, SECRETS.get, signed + timedelta(seconds=899)) == "alice"
    assert failure_of(metadata, signed + timedelta(seconds=901)) is Failure.EXPIRED
    assert failure_of(metadata, signed - timedelta(seconds=901)) is Failure.EXPIRED


@pytest.mark.parametrize(
    "authorization",
    [
        "Basic YWxpY2U6c2VjcmV0",
        "MQv2-HMAC-SHA1 Credential=alice",
        "MQv2-HMAC-SHA1 Credential=alice, Signature",
        "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=host, Signature=00",
    ],
)
def test_a_malformed_authorization_is_refused_as_malformed(authorization: str):
    metadata = [(DATE_TIME, "20261126T101500Z"), (AUTHORIZATION, authorization)]
    at = datetime(2026, 11, 26, 10, 15, 0, tzinfo=UTC)
    assert failure_of(metadata, at) is Failure.MALFORMED


def test_a_malformed_date_time_is_refused_as_malformed():
    metadata = dict(official("alice", "alice-secret"))
    metadata[DATE_TIME] = "yesterday"
    assert failure_of(list(metadata.items())) is Failure.MALFORMED
