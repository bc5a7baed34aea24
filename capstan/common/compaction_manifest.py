"""The compaction manifest: which records of a compact topic a compaction keeps.

A compaction job (spark/compaction.py) reads a topic, picks the latest record of every key
below a cut per queue, and sends the broker this manifest; the broker checks it, copies the
kept records and swaps them in (broker/store/compaction.py). Both ends compute the digest
the same way, so a manifest cut short or changed on its way is refused before anything is
swapped.

Canonical form (the manifest file a job writes is exactly this), hashed with SHA-256:
  b"capstan-compaction-manifest-v1\\n"; the topic's UTF-8 length as ">H" and the topic;
  the number of cuts as ">i" and per cut, in queue order, ">iq" (queue_id, boundary); then
  per kept record, in (queue_id, queue_offset) order, ">iqIH" (queue_id, queue_offset,
  body_crc, the key's UTF-8 length) and the key.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_PREFIX = b"capstan-compaction-manifest-v1\n"
_LENGTH = struct.Struct(">H")
_COUNT = struct.Struct(">i")
_CUT = struct.Struct(">iq")
_KEPT = struct.Struct(">iqIH")
MAX_KEY_BYTES = 0xFFFF


class ManifestError(ValueError):
    """The manifest is not well formed or does not match its digest."""


@dataclass(frozen=True, slots=True)
class QueueCut:
    """Every record of the queue below `boundary` is covered by the manifest: kept if
    listed, dropped if not."""

    queue_id: int
    boundary: int


@dataclass(frozen=True, slots=True)
class KeptRecord:
    queue_id: int
    queue_offset: int
    key: str
    """The record's KEYS property as stored; empty for a record without keys."""
    body_crc: int


class ManifestDigest:
    """SHA-256 of a manifest, fed as it streams; checks its order on the way."""

    def __init__(self, topic: str, cuts: Iterable[QueueCut]) -> None:
        self.cuts: dict[int, int] = {}
        cuts = list(cuts)
        name = topic.encode()
        self._hash = hashlib.sha256()
        self._update(_PREFIX + _LENGTH.pack(len(name)) + name + _COUNT.pack(len(cuts)))
        last = -1
        for cut in cuts:
            if cut.queue_id <= last:
                raise ManifestError("cuts must name each queue once, in increasing order")
            if cut.boundary < 0:
                raise ManifestError(f"queue {cut.queue_id}: negative boundary {cut.boundary}")
            last = cut.queue_id
            self.cuts[cut.queue_id] = cut.boundary
            self._update(_CUT.pack(cut.queue_id, cut.boundary))
        self._last: tuple[int, int] = (-1, -1)
        self.count = 0

    def _update(self, data: bytes) -> None:
        """Hash `data`; a subclass also writes it out."""
        self._hash.update(data)

    def add(self, kept: KeptRecord) -> None:
        boundary = self.cuts.get(kept.queue_id)
        if boundary is None:
            raise ManifestError(f"record {kept.queue_offset} of queue {kept.queue_id}: no cut")
        if not 0 <= kept.queue_offset < boundary:
            raise ManifestError(
                f"queue {kept.queue_id}: offset {kept.queue_offset} outside 0..{boundary - 1}"
            )
        where = (kept.queue_id, kept.queue_offset)
        if where <= self._last:
            raise ManifestError(f"queue {kept.queue_id}: offset {kept.queue_offset} out of order")
        key = kept.key.encode()
        if len(key) > MAX_KEY_BYTES:
            raise ManifestError(f"queue {kept.queue_id}: key of {len(key)} bytes")
        self._last = where
        self.count += 1
        self._update(_KEPT.pack(*where, kept.body_crc, len(key)) + key)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def digest(topic: str, cuts: Iterable[QueueCut], kept: Iterable[KeptRecord]) -> str:
    """The hex SHA-256 of a whole manifest (ManifestError if it is out of order)."""
    d = ManifestDigest(topic, cuts)
    for record in kept:
        d.add(record)
    return d.hexdigest()


class ManifestWriter(ManifestDigest):
    """Writes a manifest file (its canonical form) while hashing it."""

    def __init__(self, out: BinaryIO, topic: str, cuts: Iterable[QueueCut]) -> None:
        self._out = out
        super().__init__(topic, cuts)

    def _update(self, data: bytes) -> None:
        super()._update(data)
        self._out.write(data)


@dataclass(frozen=True, slots=True)
class ManifestFile:
    topic: str
    cuts: list[QueueCut]
    sha256: str
    count: int
    path: Path

    def records(self, batch: int = 2048) -> Iterator[list[KeptRecord]]:
        """The kept records, in batches, as written."""
        with self.path.open("rb") as f:
            f.seek(_header_bytes(self.topic, len(self.cuts)))
            records: list[KeptRecord] = []
            while head := f.read(_KEPT.size):
                if len(head) < _KEPT.size:
                    raise ManifestError(f"{self.path} ends inside a record")
                queue_id, offset, crc, length = _KEPT.unpack(head)
                key = f.read(length)
                if len(key) < length:
                    raise ManifestError(f"{self.path} ends inside a key")
                records.append(KeptRecord(queue_id, offset, key.decode(), crc))
                if len(records) >= batch:
                    yield records
                    records = []
            if records:
                yield records


def write_manifest(
    path: Path, topic: str, cuts: list[QueueCut], kept: Iterable[KeptRecord]
) -> ManifestFile:
    """Write a manifest file durably and return what describes it."""
    with path.open("wb") as out:
        writer = ManifestWriter(out, topic, cuts)
        for record in kept:
            writer.add(record)
        out.flush()
        os.fsync(out.fileno())
    return ManifestFile(topic, cuts, writer.hexdigest(), writer.count, path)


def read_manifest(path: Path) -> ManifestFile:
    """Open a manifest file, checking its framing and order (ManifestError if bad)."""
    with path.open("rb") as f:
        if f.read(len(_PREFIX)) != _PREFIX:
            raise ManifestError(f"{path} is not a compaction manifest")
        (length,) = _LENGTH.unpack(f.read(_LENGTH.size))
        topic = f.read(length).decode()
        (count,) = _COUNT.unpack(f.read(_COUNT.size))
        cuts = [QueueCut(*_CUT.unpack(f.read(_CUT.size))) for _ in range(count)]
    d = ManifestDigest(topic, cuts)
    found = ManifestFile(topic, cuts, "", 0, path)
    for batch in found.records():
        for record in batch:
            d.add(record)
    return ManifestFile(topic, cuts, d.hexdigest(), d.count, path)


def _header_bytes(topic: str, cuts: int) -> int:
    return len(_PREFIX) + _LENGTH.size + len(topic.encode()) + _COUNT.size + cuts * _CUT.size
