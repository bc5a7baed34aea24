"""The compaction manifest: the file a job writes is the canonical form both ends hash, it
reads back as written, and a torn or reordered one is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from capstan.common.compaction_manifest import (
    KeptRecord,
    ManifestError,
    QueueCut,
    digest,
    read_manifest,
    write_manifest,
)

CUTS = [QueueCut(0, 10), QueueCut(3, 5)]
KEPT = [
    KeptRecord(0, 2, "k1", 11),
    KeptRecord(0, 9, "ключ", 12),
    KeptRecord(3, 0, "", 13),
    KeptRecord(3, 4, "k1", 14),
]


def test_a_written_manifest_reads_back_with_the_digest_of_its_records(tmp_path: Path):
    written = write_manifest(tmp_path / "m", "Prices", CUTS, KEPT)
    assert written.count == 4 and written.sha256 == digest("Prices", CUTS, KEPT)
    read = read_manifest(tmp_path / "m")
    assert (read.topic, read.cuts, read.sha256, read.count) == ("Prices", CUTS, written.sha256, 4)
    assert [r for batch in read.records(batch=3) for r in batch] == KEPT
    assert digest("Prices", CUTS, KEPT[:-1]) != written.sha256
    assert digest("Prices", [QueueCut(0, 10), QueueCut(3, 6)], KEPT) != written.sha256


def test_a_torn_or_disordered_manifest_is_refused(tmp_path: Path):
    path = write_manifest(tmp_path / "m", "Prices", CUTS, KEPT).path
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ManifestError, match="ends inside"):
        read_manifest(path)
    with pytest.raises(ManifestError, match="out of order"):
        digest("Prices", CUTS, [KEPT[1], KEPT[0]])
    with pytest.raises(ManifestError, match="outside"):
        digest("Prices", CUTS, [KeptRecord(3, 5, "k", 1)])
    with pytest.raises(ManifestError, match="no cut"):
        digest("Prices", CUTS, [KeptRecord(1, 0, "k", 1)])
    with pytest.raises(ManifestError, match="increasing order"):
        digest("Prices", [QueueCut(3, 1), QueueCut(0, 1)], [])
    (tmp_path / "other").write_bytes(b"not a manifest at all")
    with pytest.raises(ManifestError, match="not a compaction manifest"):
        read_manifest(tmp_path / "other")
