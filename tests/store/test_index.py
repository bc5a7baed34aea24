"""The message index finds CommitLog offsets by key and store time, across files and restarts."""

from __future__ import annotations

import errno
import itertools
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from capstan.broker.store.index import (
    ENTRY_BYTES,
    HEADER_BYTES,
    RESERVE_STEP_BYTES,
    SLOT_BYTES,
    IndexService,
    key_hash,
)
from capstan.common.errors import ConfigError, StoreClosedError
from capstan.common.store_settings import IndexSettings
from tests.small_disk import mounted_small_disk

SMALL = IndexSettings(hash_slots_per_file=64, index_entries_per_file=256)
T0_MS = 1_700_000_000_000
WIDE = (0, 2**62)
HEADER_COUNT_AT = 36  # byte offset of index_count in the header


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    return tmp_path / "index"


@pytest.fixture
def index(directory: Path) -> Iterator[IndexService]:
    service = IndexService(directory, SMALL)
    yield service
    service.close()


def index_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.isdigit())


def fill(index: IndexService, count: int, keys: int = 10) -> None:
    """Entry i: key k<i % keys>, offset i * 100, stored one second after entry i - 1."""
    index.put_many((f"k{i % keys}", i * 100, T0_MS + i * 1000) for i in range(count))


def offsets_of(indices: Iterator[int] | range) -> list[int]:
    return [i * 100 for i in sorted(indices, reverse=True)]


def test_put_then_query_round_trip(index: IndexService) -> None:
    index.put("order-1", 100, T0_MS)
    index.put("order-2", 200, T0_MS + 5)
    index.put("order-1", 300, T0_MS + 10)

    assert index.query("order-1", *WIDE, max_results=10) == [300, 100]
    assert index.query("order-2", *WIDE, max_results=10) == [200]
    assert index.query("order-3", *WIDE, max_results=10) == []
    assert index.max_phys_offset == 300


def test_entries_outside_the_time_range_are_not_returned(index: IndexService) -> None:
    for i in range(10):
        index.put("k", i * 100, T0_MS + i * 10_000)

    found = index.query("k", T0_MS + 20_000, T0_MS + 50_000, max_results=100)

    assert found == [500, 400, 300, 200]
    assert index.query("k", T0_MS + 200_000, T0_MS + 300_000, max_results=100) == []
    assert index.query("k", T0_MS + 50_000, T0_MS + 20_000, max_results=100) == []


def test_store_time_is_known_to_the_second(index: IndexService) -> None:
    """An entry counts as stored anywhere in its second, so a query never misses it."""
    index.put("k", 100, T0_MS)
    index.put("k", 200, T0_MS + 1_500)

    assert index.query("k", T0_MS + 1_600, T0_MS + 1_700, max_results=10) == [200]
    assert index.query("k", T0_MS + 2_000, T0_MS + 9_000, max_results=10) == []


def test_newest_first_at_most_max_results_without_duplicates(index: IndexService) -> None:
    for i in range(20):
        index.put("k", i * 100, T0_MS + i)
    index.put("k", 1900, T0_MS + 30)  # re-dispatched: same offset again

    assert index.query("k", *WIDE, max_results=3) == [1900, 1800, 1700]
    assert index.query("k", *WIDE, max_results=100) == offsets_of(range(20))
    assert index.query("k", *WIDE, max_results=0) == []


def test_a_full_file_rolls_over_and_queries_span_files(
    index: IndexService, directory: Path
) -> None:
    fill(index, 600)

    assert index.file_count == 3
    assert len(index_files(directory)) == 3
    assert index.query("k3", *WIDE, max_results=1000) == offsets_of(range(3, 600, 10))
    # Seconds 250..260 straddle the first two files.
    found = index.query("k0", T0_MS + 250_000, T0_MS + 260_000, max_results=1000)
    assert found == [26000, 25000]


def test_a_reopened_index_finds_what_was_put(directory: Path) -> None:
    first = IndexService(directory, SMALL)
    fill(first, 300)
    first.flush()
    first.close()

    again = IndexService(directory, SMALL)
    try:
        assert again.file_count == 2
        assert again.max_phys_offset == 29900
        assert again.query("k7", *WIDE, max_results=1000) == offsets_of(range(7, 300, 10))
        again.put("k7", 30000, T0_MS + 300_000)
        assert again.file_count == 2  # appended to the reopened newest file
        assert again.query("k7", *WIDE, max_results=1)[0] == 30000
    finally:
        again.close()


def test_keys_with_the_same_hash_are_both_returned(index: IndexService) -> None:
    """The index only knows hashes: the caller checks the key of each message it reads."""
    assert key_hash("plumless") == key_hash("buckeroo")
    index.put("plumless", 100, T0_MS)
    index.put("buckeroo", 200, T0_MS)

    assert index.query("plumless", *WIDE, max_results=10) == [200, 100]
    assert index.query("buckeroo", *WIDE, max_results=10) == [200, 100]


def test_keys_sharing_a_slot_stay_on_one_chain(directory: Path) -> None:
    settings = IndexSettings(hash_slots_per_file=4, index_entries_per_file=64)
    first = "key-0"
    second = next(
        key
        for key in (f"key-{i}" for i in itertools.count(1))
        if key_hash(key) % 4 == key_hash(first) % 4 and key_hash(key) != key_hash(first)
    )
    service = IndexService(directory, settings)
    try:
        service.put(first, 100, T0_MS)
        service.put(second, 200, T0_MS)
        service.put(first, 300, T0_MS)

        assert service.query(first, *WIDE, max_results=10) == [300, 100]
        assert service.query(second, *WIDE, max_results=10) == [200]
    finally:
        service.close()


def test_truncate_above_drops_the_tail_and_later_puts_are_clean(index: IndexService) -> None:
    fill(index, 600)  # files hold entries 0..255, 256..511, 512..599

    dropped = index.truncate_above(300 * 100)

    assert dropped == 300
    assert index.file_count == 2
    assert index.max_phys_offset == 29900
    # The CommitLog writes new messages where the cut tail was; their offsets differ.
    index.put_many((f"k{i % 10}", i * 100 + 7, T0_MS + i * 1000) for i in range(300, 350))
    expected = [i * 100 + 7 for i in range(340, 300 - 1, -10)] + offsets_of(range(0, 300, 10))
    assert index.query("k0", *WIDE, max_results=1000) == expected
    assert index.max_phys_offset == 34907


def test_truncate_above_everything_empties_the_index(index: IndexService) -> None:
    fill(index, 100)

    assert index.truncate_above(0) == 100
    assert index.file_count == 0
    assert index.max_phys_offset == 0
    assert index.truncate_above(0) == 0
    index.put("k0", 50, T0_MS)
    assert index.query("k0", *WIDE, max_results=10) == [50]


def test_delete_files_below_keeps_the_rest_searchable(index: IndexService) -> None:
    fill(index, 600)

    assert index.delete_files_below(25600) == 1  # the first file ends at 25500
    assert index.file_count == 2
    assert index.query("k1", *WIDE, max_results=1000) == offsets_of(range(261, 600, 10))
    assert index.delete_files_below(10**12) == 1  # never the newest file
    assert index.query("k1", *WIDE, max_results=1000) == offsets_of(range(521, 600, 10))


def test_a_truncated_file_is_set_aside_on_open(directory: Path) -> None:
    first = IndexService(directory, SMALL)
    fill(first, 300)
    first.close()
    oldest = index_files(directory)[0]
    with oldest.open("r+b") as handle:
        handle.truncate(10)

    again = IndexService(directory, SMALL)
    try:
        assert again.file_count == 1
        assert oldest.with_name(oldest.name + ".corrupt").exists()
        assert again.query("k0", *WIDE, max_results=1000) == offsets_of(range(260, 300, 10))
        again.put("k0", 30000, T0_MS + 300_000)
        assert again.query("k0", *WIDE, max_results=1)[0] == 30000
    finally:
        again.close()


def test_a_header_counting_too_many_entries_is_set_aside(directory: Path) -> None:
    first = IndexService(directory, SMALL)
    fill(first, 10)
    first.close()
    (only,) = index_files(directory)
    with only.open("r+b") as handle:
        handle.seek(HEADER_COUNT_AT)
        handle.write(struct.pack(">I", SMALL.index_entries_per_file + 1))

    again = IndexService(directory, SMALL)
    try:
        assert again.file_count == 0
        assert again.query("k0", *WIDE, max_results=10) == []
    finally:
        again.close()


def test_an_entry_lost_from_the_header_does_not_break_its_chain(directory: Path) -> None:
    """A crash after writing entry 3 and its slot, before the header: entry 3 is not counted."""
    first = IndexService(directory, SMALL)
    for i in range(3):
        first.put("k", i * 100, T0_MS)
    first.close()
    (only,) = index_files(directory)
    with only.open("r+b") as handle:
        handle.seek(HEADER_COUNT_AT)
        handle.write(struct.pack(">I", 2))

    again = IndexService(directory, SMALL)
    try:
        assert again.query("k", *WIDE, max_results=10) == [100, 0]
        again.put("k", 500, T0_MS)
        assert again.query("k", *WIDE, max_results=10) == [500, 100, 0]
    finally:
        again.close()


def test_a_clock_stepping_back_starts_a_new_file(index: IndexService) -> None:
    index.put("k", 100, T0_MS + 60_000)
    index.put("k", 200, T0_MS)

    assert index.file_count == 2
    assert index.query("k", T0_MS, T0_MS + 1_000, max_results=10) == [200]
    assert index.query("k", *WIDE, max_results=10) == [200, 100]


def test_concurrent_puts_and_flushes_lose_nothing(index: IndexService) -> None:
    def writer(thread: int) -> None:
        for i in range(200):
            index.put(f"t{thread}", thread * 1000 + i, T0_MS + i)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(20):
        index.flush()
    for thread in threads:
        thread.join()
    index.flush()

    for t in range(4):
        assert sorted(index.query(f"t{t}", *WIDE, max_results=1000)) == [
            t * 1000 + i for i in range(200)
        ]


def test_a_closed_index_refuses_work(index: IndexService) -> None:
    index.put("k", 100, T0_MS)
    index.close()

    with pytest.raises(StoreClosedError):
        index.put("k", 200, T0_MS)
    with pytest.raises(StoreClosedError):
        index.put_many([("k", 200, T0_MS)])
    with pytest.raises(StoreClosedError):
        index.query("k", *WIDE, max_results=10)
    index.flush()  # a background flusher racing close must not fail
    index.close()


@pytest.mark.parametrize("field", ["hash_slots_per_file", "index_entries_per_file"])
@pytest.mark.parametrize("value", [0, 2**32])
def test_settings_out_of_range_are_refused_by_name(field: str, value: int) -> None:
    with pytest.raises(ConfigError, match=field):
        IndexSettings(**{field: value})


def disk_bytes(path: Path) -> int:
    return path.stat().st_blocks * 512


def test_a_default_index_file_takes_the_disk_it_holds_not_its_size(tmp_path: Path) -> None:
    # RocketMQ's default sizes: 5 million slots and 20 million entries, a 420 MB file.
    settings = IndexSettings()
    service = IndexService(tmp_path / "index", settings)
    try:
        service.put_many((f"k{i}", i * 100, T0_MS + i) for i in range(300_000))
        (path,) = index_files(tmp_path / "index")
        slots_end = HEADER_BYTES + settings.hash_slots_per_file * SLOT_BYTES
        held = 300_000 * ENTRY_BYTES
        assert path.stat().st_size == slots_end + settings.index_entries_per_file * ENTRY_BYTES
        # The header, the slots, the entries and at most one step of room ahead.
        assert slots_end + held <= disk_bytes(path) <= slots_end + held + RESERVE_STEP_BYTES + 4096
    finally:
        service.close()
    reopened = IndexService(tmp_path / "index", settings)
    try:
        assert reopened.query("k299999", *WIDE, max_results=5) == [29_999_900]
        reopened.put("after", 30_000_000, T0_MS + 300_000)
        assert reopened.query("after", *WIDE, max_results=5) == [30_000_000]
    finally:
        reopened.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MiB filesystem that a test can fill up."""
    with mounted_small_disk(tmp_path / "disk", 8 << 20) as disk:
        yield disk


@pytest.mark.chaos
def test_an_index_on_a_full_disk_refuses_puts_and_takes_them_once_there_is_room(
    small_disk: Path,
) -> None:
    # Each file is 40 + 4,096 + 1,000,000 x 20 bytes, far more than the disk: only what
    # it holds is allocated, and a put past that on a full disk must be an OSError (an
    # unallocated page written through mmap would kill this process with SIGBUS).
    settings = IndexSettings(hash_slots_per_file=1024, index_entries_per_file=1_000_000)
    service = IndexService(small_disk / "index", settings)
    filler = small_disk / "filler"
    try:
        service.put_many((f"k{i}", i, T0_MS) for i in range(1000))
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
        put = 1000
        with pytest.raises(OSError) as refused:
            while put < 1_000_000:
                service.put_many((f"k{i}", i, T0_MS) for i in range(put, put + 1000))
                put += 1000
        assert refused.value.errno == errno.ENOSPC
        assert service.query(f"k{put - 1}", *WIDE, max_results=5) == [put - 1]
        assert service.query(f"k{put}", *WIDE, max_results=5) == []

        filler.unlink()
        service.put_many((f"k{i}", i, T0_MS) for i in range(put, put + 1000))
        assert service.query(f"k{put}", *WIDE, max_results=5) == [put]
    finally:
        service.close()
    reopened = IndexService(small_disk / "index", settings)
    try:
        assert reopened.query("k0", *WIDE, max_results=5) == [0]
        assert reopened.query(f"k{put + 999}", *WIDE, max_results=5) == [put + 999]
    finally:
        reopened.close()
