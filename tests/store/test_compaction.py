"""Compacted copies on one store: a manifest checked and swapped in whole, reads that skip
what it dropped, the swap surviving a restart, and the CommitLog space it gives back."""

from __future__ import annotations

import asyncio
import pathlib
import threading
import time
from collections.abc import AsyncIterator

import pytest

from capstan.broker.edge.v1.compaction_call import compact_topic
from capstan.broker.store import compaction_session
from capstan.broker.store.compaction import AlreadyCompacted, CompactionRefused
from capstan.broker.store.compaction_session import CompactionSession
from capstan.broker.store.message import Message
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.properties import PROPERTY_KEYS
from capstan.broker.store.status import GetStatus, PutStatus
from capstan.broker.store.topic_config import TopicConfig
from capstan.common.compaction_manifest import KeptRecord, ManifestError, QueueCut, digest
from capstan.v1 import admin_pb2 as apb

from .conftest import SEGMENT_BYTES, small_settings

TABLE = "Prices"
RESERVED_HOURS = 72.0


def open_compact(root: pathlib.Path, queues: int = 2) -> MessageStore:
    store = MessageStore(root, small_settings(), disk_usage=lambda _: 0.10)
    if store.topics.get(TABLE) is None:
        attributes = {"cleanup.policy": "COMPACT"}
        store.topics.put(TopicConfig(TABLE, queues, queues, attributes=attributes))
    return store


def put(store: MessageStore, queue_id: int, key: str, body: bytes, topic: str = TABLE) -> int:
    result = store.put([Message(topic, queue_id, body, {PROPERTY_KEYS: key} if key else {})])
    assert result.status is PutStatus.PUT_OK, result
    return result.appended[0].queue_offset


def read_all(
    store: MessageStore, queue_id: int, topic: str = TABLE
) -> list[tuple[int, str, bytes]]:
    """(queue offset, keys, body) of every record a consumer from the start gets."""
    low, high = store.queue_bounds(topic, queue_id) or (0, 0)
    found, offset = [], low
    while offset < high:
        result = store.get(topic, queue_id, offset, 16)
        found += [
            (m.queue_offset, m.properties.get(PROPERTY_KEYS, ""), m.body) for m in result.messages
        ]
        assert result.next_begin_offset > offset, result
        offset = result.next_begin_offset
    return found


def latest_per_key(store: MessageStore, cuts: list[QueueCut]) -> list[KeptRecord]:
    """What a compaction job keeps: the last record of each key below each cut."""
    kept = []
    for cut in cuts:
        latest: dict[str, KeptRecord] = {}
        low, _ = store.queue_bounds(TABLE, cut.queue_id) or (0, 0)
        offset = low
        while offset < cut.boundary:
            result = store.get(TABLE, cut.queue_id, offset, 16)
            for m in result.messages:
                if m.queue_offset < cut.boundary:
                    key = m.properties.get(PROPERTY_KEYS, "")
                    latest[key or f"\0{m.queue_offset}"] = KeptRecord(
                        cut.queue_id, m.queue_offset, key, m.body_crc
                    )
            offset = result.next_begin_offset
        kept += sorted(latest.values(), key=lambda k: k.queue_offset)
    return kept


def compact(store: MessageStore, cuts: list[QueueCut], kept: list[KeptRecord] | None = None):
    kept = latest_per_key(store, cuts) if kept is None else kept
    session = CompactionSession(store, TABLE, cuts, "test")
    session.add(kept)
    return session.finish(digest(TABLE, cuts, kept), len(kept))


def cuts_at_end(store: MessageStore, queues: int = 2) -> list[QueueCut]:
    return [QueueCut(q, (store.queue_bounds(TABLE, q) or (0, 0))[1]) for q in range(queues)]


def test_latest_record_per_key_stays_at_its_offset_and_survives_a_restart(tmp_path: pathlib.Path):
    store = open_compact(tmp_path / "s")
    try:
        for round_ in range(5):
            for k in range(4):
                put(store, k % 2, f"k{k}", f"v{round_}-{k}".encode())
        put(store, 0, "", b"no key")  # records without a key are always kept
        generation, outcomes = compact(store, cuts_at_end(store))
        assert generation == 1
        assert [(o.queue_id, o.boundary, o.kept, o.dropped) for o in outcomes] == [
            (0, 11, 3, 8),
            (1, 10, 2, 8),
        ]
        expected_q0 = [(8, "k0", b"v4-0"), (9, "k2", b"v4-2"), (10, "", b"no key")]
        assert read_all(store, 0) == expected_q0
        assert store.queue_bounds(TABLE, 0) == (8, 11)
        after = put(store, 0, "k0", b"v5-0")  # appends go on past the cut
        assert after == 11
        assert read_all(store, 0)[-1] == (11, "k0", b"v5-0")
        # A read from a dropped offset lands on the next kept record.
        result = store.get(TABLE, 1, 0, 4)
        assert result.status is GetStatus.OFFSET_TOO_SMALL and result.next_begin_offset == 8
        result = store.get(TABLE, 0, 8, 1)
        assert [m.queue_offset for m in result.messages] == [8] and result.next_begin_offset == 9
    finally:
        store.close()
    reopened = open_compact(tmp_path / "s")
    try:
        assert read_all(reopened, 0) == [*expected_q0, (11, "k0", b"v5-0")]
        assert reopened.compacted.generation(TABLE) == 1
    finally:
        reopened.close()


def test_a_second_compaction_builds_on_the_first(tmp_path: pathlib.Path):
    store = open_compact(tmp_path / "s", queues=1)
    try:
        for i in range(6):
            put(store, 0, f"k{i % 3}", f"a{i}".encode())
        compact(store, cuts_at_end(store, 1))
        put(store, 0, "k0", b"b0")
        put(store, 0, "k9", b"b9")
        generation, [outcome] = compact(store, cuts_at_end(store, 1))
        assert generation == 2 and (outcome.kept, outcome.dropped) == (4, 1)
        assert read_all(store, 0) == [
            (4, "k1", b"a4"),
            (5, "k2", b"a5"),
            (6, "k0", b"b0"),
            (7, "k9", b"b9"),
        ]
        # Only the live generation's directory is left.
        assert sorted(p.name for p in (tmp_path / "s" / "compacted" / TABLE).iterdir()) == [
            "CURRENT",
            "gen-00000002",
        ]
    finally:
        store.close()


def test_a_manifest_waits_for_a_swap_under_way_and_a_run_already_live_swaps_nothing(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
):
    """A slave may be installing its master's copy (or another run's) when a job's manifest
    arrives: the manifest waits for it, and a run whose copy is live already is answered
    with that generation, so the replicas' generations stay equal."""
    store = open_compact(tmp_path / "s", queues=1)
    try:
        for i in range(8):
            put(store, 0, f"k{i % 3}", f"v{i}".encode())
        cuts = cuts_at_end(store, 1)
        kept = latest_per_key(store, cuts)
        first = CompactionSession(store, TABLE, cuts, "run-1")
        first.add(kept)
        outcome: list[object] = []

        def second_run() -> None:
            began = time.monotonic()
            session = CompactionSession(store, TABLE, cuts, "run-2")
            outcome.append(time.monotonic() - began)
            session.add(kept)
            outcome.append(session.finish(digest(TABLE, cuts, kept), len(kept)))

        waiting = threading.Thread(target=second_run)
        waiting.start()
        time.sleep(0.5)
        assert not outcome, "the second run did not wait for the first's swap"
        assert first.finish(digest(TABLE, cuts, kept), len(kept))[0] == 1
        waiting.join(10)
        waited, (generation, _) = outcome
        assert waited >= 0.4 and generation == 2
        assert [key for _, key, _ in read_all(store, 0)] == ["k2", "k0", "k1"]
        with pytest.raises(AlreadyCompacted) as already:
            CompactionSession(store, TABLE, cuts, "run-2")
        assert already.value.generation == 2 and store.compacted.generation(TABLE) == 2
        # A swap that does not end in time refuses the manifest, with the reason.
        monkeypatch.setattr(compaction_session, "BUSY_WAIT_S", 0.2)
        held = CompactionSession(store, TABLE, cuts, "run-3")
        with pytest.raises(CompactionRefused, match="already running here"):
            CompactionSession(store, TABLE, cuts, "run-4")
        held.abandon()
        assert store.compacted.generation(TABLE) == 2
    finally:
        store.close()


def test_a_job_gone_while_its_manifest_waited_for_the_topic_leaves_nothing_behind(
    tmp_path: pathlib.Path,
):
    """A job killed while the broker's worker thread still opened its manifest (waiting for
    another swap of the topic): once that thread has opened it, it is abandoned, so no
    generation directory stays and the next manifest does not find the topic taken."""
    store = open_compact(tmp_path / "s", queues=1)
    try:
        for i in range(8):
            put(store, 0, f"k{i % 3}", f"v{i}".encode())
        cuts = cuts_at_end(store, 1)
        held = CompactionSession(store, TABLE, cuts, "run-1")

        def left_behind() -> list[str]:
            found = [p.name for p in (store.compacted.root / TABLE).glob("gen-*")]
            try:
                store.compacted.begin(TABLE)
            except CompactionRefused:
                return [*found, "the topic still taken"]
            store.compacted.abandon(TABLE, store.compacted.root / TABLE / "gen-00000001")
            return found

        async def killed_job() -> list[str]:
            async def chunks() -> AsyncIterator[apb.CompactionChunk]:
                wire = [apb.CompactionCut(queue_id=c.queue_id, boundary=c.boundary) for c in cuts]
                header = apb.CompactionHeader(topic=TABLE, cuts=wire, job="run-2")
                yield apb.CompactionChunk(header=header)
                await asyncio.Event().wait()  # the job holds, then dies

            call = asyncio.create_task(compact_topic(store, chunks(), context=None))
            await asyncio.sleep(0.5)  # its header waits for run-1 on a worker thread
            call.cancel()  # the job's connection broke
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.to_thread(held.abandon)  # run-1 ends; run-2's session opens
            await asyncio.sleep(1.0)  # before the check below would take the topic itself
            return await asyncio.to_thread(cleared)

        def cleared() -> list[str]:
            deadline = time.monotonic() + 10
            while (found := left_behind()) and time.monotonic() < deadline:
                time.sleep(0.05)
            return found

        assert asyncio.run(killed_job()) == []
    finally:
        store.close()


def test_a_manifest_that_does_not_fit_changes_nothing(tmp_path: pathlib.Path):
    store = open_compact(tmp_path / "s", queues=1)
    try:
        for i in range(6):
            put(store, 0, f"k{i % 2}", f"v{i}".encode())
        before = read_all(store, 0)
        cuts = cuts_at_end(store, 1)
        good = latest_per_key(store, cuts)

        def refused(kept: list[KeptRecord], sha: str | None = None, count: int | None = None):
            session = CompactionSession(store, TABLE, cuts, "bad")
            with pytest.raises((CompactionRefused, ManifestError)) as caught:
                session.add(kept)
                session.finish(
                    sha or digest(TABLE, cuts, kept), len(kept) if count is None else count
                )
            assert read_all(store, 0) == before
            assert store.compacted.generation(TABLE) == 0
            return str(caught.value)

        wrong_key = [good[0], KeptRecord(0, good[1].queue_offset, "other", good[1].body_crc)]
        assert "key 'other'" in refused(wrong_key)
        wrong_crc = [KeptRecord(0, good[0].queue_offset, good[0].key, 1), good[1]]
        assert "CRC 1" in refused(wrong_crc)
        assert "checksum" in refused(good, sha="0" * 64)
        assert "checksum" in refused(good, count=len(good) + 1)
        assert "out of order" in refused(list(reversed(good)))
        with pytest.raises(CompactionRefused, match="below the cut"):
            CompactionSession(store, TABLE, [QueueCut(0, 99)], "ahead")
        with pytest.raises(CompactionRefused, match="not compact"):
            store.topics.put(TopicConfig("Plain", 1, 1))
            CompactionSession(store, "Plain", [QueueCut(0, 0)], "plain")
        # The stream of an abandoned session leaves no directory behind.
        assert sorted(p.name for p in (tmp_path / "s" / "compacted" / TABLE).iterdir()) == []
        compact(store, cuts, good)
        with pytest.raises(CompactionRefused, match="newer compaction"):
            CompactionSession(store, TABLE, [QueueCut(0, 2)], "late")
    finally:
        store.close()


KILLED_MID_SWAP = """
import os, sys
sys.path.insert(0, {tests!r})
from store.test_compaction import open_compact, put, compact, cuts_at_end, latest_per_key
from capstan.broker.store.compaction_session import CompactionSession
store = open_compact({root!r}, queues=1)
for i in range(4):
    put(store, 0, f"k{{i % 2}}", b"v")
compact(store, cuts_at_end(store, 1))
put(store, 0, "k0", b"w")
session = CompactionSession(store, "Prices", cuts_at_end(store, 1), "dies")
session.add(latest_per_key(store, cuts_at_end(store, 1)))
os._exit(0)  # killed with generation 2 written but CURRENT still naming 1
"""


def test_a_generation_built_but_not_swapped_is_removed_when_the_store_opens(tmp_path: pathlib.Path):
    import subprocess
    import sys

    tests = str(pathlib.Path(__file__).resolve().parents[1])
    code = KILLED_MID_SWAP.format(tests=tests, root=str(tmp_path / "s"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    topic_dir = tmp_path / "s" / "compacted" / TABLE
    assert (topic_dir / "gen-00000002").is_dir()
    reopened = open_compact(tmp_path / "s", queues=1)
    try:
        assert read_all(reopened, 0) == [(2, "k0", b"v"), (3, "k1", b"v"), (4, "k0", b"w")]
        assert sorted(p.name for p in topic_dir.iterdir()) == ["CURRENT", "gen-00000001"]
    finally:
        reopened.close()


def commitlog_bytes(root: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in (root / "commitlog").iterdir())


def test_compaction_gives_the_commitlog_space_back(tmp_path: pathlib.Path):
    store = open_compact(tmp_path / "s", queues=1)
    try:
        body = b"x" * 900
        for i in range(400):  # ~6 segments of 64 KiB, 10 keys
            put(store, 0, f"k{i % 10}", body + str(i).encode())
        segments = len(store.commitlog.files.segments)
        assert segments >= 6
        assert store.run_retention() == 0  # young segments of an uncompacted compact topic
        assert store.run_retention(now_s=time.time() + RESERVED_HOURS * 3600 + 60) == 0
        before = commitlog_bytes(tmp_path / "s")
        compact(store, cuts_at_end(store, 1))
        deleted = store.run_retention()
        assert deleted == segments - 2
        assert commitlog_bytes(tmp_path / "s") <= before - (segments - 2) * (SEGMENT_BYTES - 2048)
        kept = read_all(store, 0)
        assert [k for _, k, _ in kept] == [f"k{i}" for i in range(10)]
        assert all(
            body == b"x" * 900 + str(390 + i).encode() for i, (_, _, body) in enumerate(kept)
        )
    finally:
        store.close()
    reopened = open_compact(tmp_path / "s", queues=1)
    try:
        assert read_all(reopened, 0) == kept
    finally:
        reopened.close()


def test_records_of_other_topics_keep_their_segments(tmp_path: pathlib.Path):
    store = open_compact(tmp_path / "s", queues=1)
    try:
        store.topics.put(TopicConfig("Plain", 1, 1))
        put(store, 0, "p", b"plain", topic="Plain")
        for i in range(300):
            put(store, 0, f"k{i % 5}", b"y" * 900)
        compact(store, cuts_at_end(store, 1))
        assert store.run_retention() == 0  # the plain record pins the first segment
        assert [b for _, _, b in read_all(store, 0, topic="Plain")] == [b"plain"]
    finally:
        store.close()


def test_the_watermark_still_deletes_and_reads_then_skip_the_lost_records(tmp_path: pathlib.Path):
    full = [0.10]
    store = MessageStore(tmp_path / "s", small_settings(), disk_usage=lambda _: full[0])
    try:
        store.topics.put(TopicConfig(TABLE, 1, 1, attributes={"cleanup.policy": "compact"}))
        for i in range(200):
            put(store, 0, f"k{i % 5}", b"z" * 900)
        compact(store, [QueueCut(0, 50)])
        for i in range(200, 400):
            put(store, 0, f"k{i % 5}", b"z" * 900)
        full[0] = 0.99
        store.run_retention()
        low, high = store.queue_bounds(TABLE, 0) or (0, 0)
        assert low == 45  # the copy still holds what it kept below its cut
        offsets = [o for o, _, _ in read_all(store, 0)]
        assert offsets[:5] == [45, 46, 47, 48, 49]
        assert offsets[5] == store.consume_queue_min(TABLE, 0) > 50
        assert offsets[-1] == high - 1
    finally:
        store.close()


def test_deleting_a_topic_deletes_its_compacted_copy(tmp_path: pathlib.Path):
    store = open_compact(tmp_path / "s", queues=1)
    try:
        put(store, 0, "k", b"v")
        compact(store, cuts_at_end(store, 1))
        store.delete_topic(TABLE)
        assert not (tmp_path / "s" / "compacted" / TABLE).exists()
    finally:
        store.close()
    assert list((tmp_path / "s" / "compacted").iterdir()) == []
