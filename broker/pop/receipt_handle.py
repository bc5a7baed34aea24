"""Receipt handles: opaque to clients, checkable by the broker.

A handle names the queue position it was issued for and a sequence number unique to that
issue, and carries a MAC over both (keyed by a secret kept in the data directory, so handles
outlive a restart). A handle whose MAC does not match was not made by this broker; one whose
sequence number is no longer the message's current one is stale.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path

from capstan.common.durable_files import replace_durably

_VERSION = "c2"
"""Handles carry a keyed BLAKE2b tag; "c1" handles (HMAC-SHA256, from brokers before it)
are still accepted, so an upgrade does not invalidate messages in flight."""
_VERSION_HMAC = "c1"
_MAC_BYTES = 8
_MAC_HEX = 2 * _MAC_BYTES
_MAX_KEY_BYTES = 64  # BLAKE2b's key limit


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    queue_id: int
    offset: int
    seq: int


class HandleCodec:
    def __init__(self, key: bytes, path: Path | None = None) -> None:
        """`path` is where the key is kept (a key adopted later is written there)."""
        self._key = key
        self._path = path

    @classmethod
    def from_key_file(cls, path: Path) -> HandleCodec:
        """Load the broker's handle key, creating it on first start."""
        try:
            key = bytes.fromhex(path.read_text().strip())
            if 16 <= len(key) <= _MAX_KEY_BYTES:
                return cls(key, path)
        except (OSError, ValueError):
            pass
        key = secrets.token_bytes(32)
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_durably(path, key.hex().encode())
        return cls(key, path)

    @property
    def key(self) -> bytes:
        return self._key

    def adopt_key(self, key: bytes) -> None:
        """Sign and check with `key` (a master's, so its handles stay valid here), kept in
        the key file, when there is one, for restarts."""
        if not 16 <= len(key) <= _MAX_KEY_BYTES:
            raise ValueError(f"a handle key has 16 to {_MAX_KEY_BYTES} bytes, not {len(key)}")
        if key != self._key:
            if self._path is not None:
                replace_durably(self._path, key.hex().encode())
            self._key = key

    def tag(self, scope: str, topic: str, body: str) -> str:
        """The keyed tag over a handle's `body` for `topic` and `scope` (a consumer group
        for receipt handles); other handles of the broker (recall handles) use it too, with
        bodies of their own version prefix, so one kind never passes for another."""
        return self._mac(scope, topic, body)

    def _mac(self, group: str, topic: str, body: str, version: str = _VERSION) -> str:
        msg = f"{group}\n{topic}\n{body}".encode()
        if version == _VERSION_HMAC:
            return hmac.digest(self._key, msg, "sha256").hex()[:_MAC_HEX]
        return hashlib.blake2b(msg, key=self._key, digest_size=_MAC_BYTES).hexdigest()

    def encode(self, group: str, topic: str, handle: ReceiptHandle) -> str:
        body = f"{_VERSION}.{handle.queue_id:x}.{handle.offset:x}.{handle.seq:x}"
        return f"{body}.{self._mac(group, topic, body)}"

    def decode(self, group: str, topic: str, text: str) -> ReceiptHandle | None:
        """The handle, or None if it is malformed or was not issued for this group and topic."""
        parts = text.split(".")
        if len(parts) != 5 or parts[0] not in (_VERSION, _VERSION_HMAC):
            return None
        body, mac = text.rsplit(".", 1)
        expected = self._mac(group, topic, body, parts[0])
        if not hmac.compare_digest(mac.encode(), expected.encode()):  # str: ASCII only
            return None
        try:
            return ReceiptHandle(int(parts[1], 16), int(parts[2], 16), int(parts[3], 16))
        except ValueError:
            return None
