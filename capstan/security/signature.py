"""The request signature of the official RocketMQ 5 clients, made and checked.

Every call of a RocketMQ 5 client carries two metadata entries:

    x-mq-date-time: 20261126T101500Z
    authorization:  MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
                    Signature=<hex of HMAC-SHA1(secret key, the x-mq-date-time value)>

The signed value is the time alone, so a signature proves the caller holds the secret key
and, with a bounded clock skew, that it signed recently; TLS keeps it from being read off
the wire and replayed.
"""

from __future__ import annotations

import functools
import hmac
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from hashlib import sha1

SCHEME = "MQv2-HMAC-SHA1"
AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
MAX_CLOCK_SKEW_S = 900.0
"""In seconds: how far a signed time may be from the server's clock, either way."""


@dataclass(frozen=True, slots=True)
class Credentials:
    access_key: str
    secret_key: str

    def __repr__(self) -> str:  # never the secret
        return f"Credentials(access_key={self.access_key!r})"


class Failure(Enum):
    """Why a call's signature was refused: the `reason` label of capstan_auth_failures_total."""

    MISSING = "missing"
    MALFORMED = "malformed"
    UNKNOWN_USER = "unknown_user"
    DISABLED_USER = "disabled_user"
    WRONG_SIGNATURE = "wrong_signature"
    EXPIRED = "expired"
    FORGED_FORWARDING = "forged_forwarding"


class AuthenticationError(Exception):
    def __init__(self, failure: Failure, detail: str) -> None:
        super().__init__(detail)
        self.failure = failure
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Authorization:
    """The parsed `authorization` entry."""

    access_key: str
    signed_headers: tuple[str, ...]
    signature: str


# Signing and checking are per call, but a signature changes once a second per key: the
# pure steps below keep their recent answers (bounded, so a flood of distinct headers only
# evicts), which takes most of the per-call cost off both sides.
_RECENT = 4096


@functools.lru_cache(maxsize=_RECENT)
def signature_of(secret_key: str, date_time: str) -> str:
    return hmac.new(secret_key.encode(), date_time.encode(), sha1).hexdigest()


@functools.lru_cache(maxsize=256)
def _header(credentials: Credentials, stamp: str) -> str:
    return (
        f"{SCHEME} Credential={credentials.access_key}, SignedHeaders={DATE_TIME}, "
        f"Signature={signature_of(credentials.secret_key, stamp)}"
    )


def signed_metadata(credentials: Credentials, now: datetime | None = None) -> list[tuple[str, str]]:
    """The two entries that sign one call."""
    if now is None:
        stamp = time.strftime(DATE_TIME_FORMAT, time.gmtime())
    else:
        stamp = now.strftime(DATE_TIME_FORMAT)
    return [(DATE_TIME, stamp), (AUTHORIZATION, _header(credentials, stamp))]


@functools.lru_cache(maxsize=_RECENT)
def parse_authorization(value: str) -> Authorization:
    scheme, _, rest = value.strip().partition(" ")
    if scheme != SCHEME:
        raise AuthenticationError(
            Failure.MALFORMED, f"the authorization scheme must be {SCHEME}, not {scheme[:40]!r}"
        )
    fields: dict[str, str] = {}
    for item in rest.split(","):
        name, equals, field_value = item.strip().partition("=")
        if not equals:
            raise AuthenticationError(Failure.MALFORMED, "an authorization field lacks '='")
        fields[name] = field_value.strip()
    access_key, signature = fields.get("Credential", ""), fields.get("Signature", "")
    if not access_key:
        raise AuthenticationError(Failure.MISSING, "the authorization names no access key")
    if not signature:
        raise AuthenticationError(Failure.MALFORMED, "the authorization carries no signature")
    headers = tuple(h for h in fields.get("SignedHeaders", DATE_TIME).split(";") if h)
    return Authorization(access_key, headers, signature)


@functools.lru_cache(maxsize=256)
def signed_time(date_time: str) -> datetime:
    try:
        return datetime.strptime(date_time, DATE_TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        raise AuthenticationError(
            Failure.MALFORMED, f"{DATE_TIME} must read like 20261126T101500Z"
        ) from None


def first(metadata: Iterable[tuple[str, str | bytes]], key: str) -> str | None:
    for name, value in metadata:
        if name == key:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return None


SecretOf = Callable[[str], "str | None"]
"""An access key's secret key, or None for a key nobody holds (or a disabled user's:
the caller says which by raising)."""


def verify(
    metadata: Sequence[tuple[str, str | bytes]],
    secret_of: SecretOf,
    now: datetime,
    max_skew_s: float = MAX_CLOCK_SKEW_S,
) -> str:
    """The access key whose secret signed this call; AuthenticationError if none did."""
    header = first(metadata, AUTHORIZATION)
    if header is None or not header.strip():
        raise AuthenticationError(Failure.MISSING, "the call is not signed (no authorization)")
    auth = parse_authorization(header)
    if DATE_TIME not in auth.signed_headers:
        raise AuthenticationError(Failure.MALFORMED, f"the signature must cover {DATE_TIME}")
    stamp = first(metadata, DATE_TIME)
    if stamp is None:
        raise AuthenticationError(Failure.MALFORMED, f"the call carries no {DATE_TIME}")
    skew = abs((now - signed_time(stamp)).total_seconds())
    if skew > max_skew_s:
        raise AuthenticationError(
            Failure.EXPIRED,
            f"the call was signed at {stamp}, {skew:.0f} s from the server's clock "
            f"(at most {max_skew_s:.0f} s is accepted)",
        )
    secret = secret_of(auth.access_key)
    if secret is None:
        raise AuthenticationError(
            Failure.UNKNOWN_USER, f"no user has the access key {auth.access_key[:64]!r}"
        )
    if not hmac.compare_digest(signature_of(secret, stamp), auth.signature.lower()):
        raise AuthenticationError(
            Failure.WRONG_SIGNATURE,
            f"the signature does not match the secret key of {auth.access_key[:64]!r}",
        )
    return auth.access_key
