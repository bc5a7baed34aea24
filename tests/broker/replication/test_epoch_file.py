"""The epoch file: its rules, its on-disk format, and the consistent-offset decision."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from capstan.broker.replication.epoch_file import (
    EpochEntry,
    EpochFile,
    appended,
    check_history,
    decode_epoch_file,
    encode_epoch_file,
    entry_end,
    find_consistent_offset,
    truncated_from,
)
from capstan.common.errors import StoreCorruptError


def history(*pairs: tuple[int, int]) -> tuple[EpochEntry, ...]:
    return tuple(EpochEntry(epoch, start) for epoch, start in pairs)


# -- pure rules ---------------------------------------------------------------------------


def test_entry_rejects_negative_numbers() -> None:
    with pytest.raises(ValueError):
        EpochEntry(-1, 0)
    with pytest.raises(ValueError):
        EpochEntry(1, -1)


@pytest.mark.parametrize(
    ("entry", "accepted"),
    [
        (EpochEntry(3, 200), True),
        (EpochEntry(3, 100), True),  # the previous epoch wrote nothing
        (EpochEntry(9, 10_000), True),  # epochs may be skipped
        (EpochEntry(2, 200), False),  # same epoch
        (EpochEntry(1, 200), False),  # older epoch
        (EpochEntry(3, 99), False),  # starts before the last one
    ],
)
def test_appended_requires_a_newer_epoch_not_starting_earlier(
    entry: EpochEntry, accepted: bool
) -> None:
    entries = history((1, 0), (2, 100))
    if accepted:
        assert appended(entries, entry) == (*entries, entry)
    else:
        with pytest.raises(ValueError):
            appended(entries, entry)


def test_appended_to_nothing_takes_anything() -> None:
    assert appended((), EpochEntry(5, 700)) == history((5, 700))


def test_truncated_from_drops_entries_starting_at_or_after_the_offset() -> None:
    entries = history((1, 0), (2, 100), (3, 100), (4, 250))
    assert truncated_from(entries, 251) == entries
    assert truncated_from(entries, 250) == entries[:3]
    assert truncated_from(entries, 101) == entries[:3]
    assert truncated_from(entries, 100) == entries[:1]
    assert truncated_from(entries, 1) == entries[:1]
    assert truncated_from(entries, 0) == ()


def test_entry_end_is_the_next_start_or_the_max_offset() -> None:
    entries = history((1, 0), (2, 100), (3, 100))
    assert [entry_end(entries, i, 180) for i in range(3)] == [100, 100, 180]


def test_check_history_rejects_disorder_and_entries_beyond_the_log() -> None:
    check_history(history((1, 0), (2, 0), (5, 40)), max_offset=40)
    with pytest.raises(ValueError):
        check_history(history((2, 0), (1, 10)))
    with pytest.raises(ValueError):
        check_history(history((1, 50), (2, 10)))
    with pytest.raises(ValueError):
        check_history(history((1, 0), (2, 41)), max_offset=40)


# -- find_consistent_offset: the named cases ----------------------------------------------


def test_identical_logs_agree_to_the_end() -> None:
    entries = history((1, 0), (2, 100), (3, 250))
    assert find_consistent_offset(entries, 400, entries, 400) == 400


def test_replica_behind_keeps_all_it_has() -> None:
    replica = history((1, 0), (2, 100))
    master = history((1, 0), (2, 100), (3, 250))
    assert find_consistent_offset(replica, 180, master, 400) == 180


def test_replica_behind_in_the_masters_last_epoch() -> None:
    entries = history((1, 0), (2, 100))
    assert find_consistent_offset(entries, 150, entries, 400) == 150


def test_replica_ahead_in_the_same_epoch_is_cut_at_the_masters_end_of_it() -> None:
    # The replica was master of epoch 2 and wrote to 300; the new master (epoch 3) had
    # copied epoch 2 only up to 220.
    replica = history((1, 0), (2, 100))
    master = history((1, 0), (2, 100), (3, 220))
    assert find_consistent_offset(replica, 300, master, 500) == 220


def test_replica_ahead_of_a_master_that_is_still_in_that_epoch() -> None:
    entries = history((1, 0), (2, 100))
    assert find_consistent_offset(entries, 300, entries, 260) == 260


def test_deposed_master_tail_under_an_epoch_the_master_never_had() -> None:
    # The replica, elected for epoch 3 at 150, wrote to 260 before anyone copied it; the
    # master was then elected for epoch 4 at its own end of epoch 2, 150.
    replica = history((1, 0), (2, 100), (3, 150))
    master = history((1, 0), (2, 100), (4, 150))
    assert find_consistent_offset(replica, 260, master, 400) == 150


def test_deposed_master_tail_reaching_past_the_masters_epoch_start() -> None:
    # As above, but the master had copied epoch 2 only to 120 when it was elected.
    replica = history((1, 0), (2, 100), (3, 150))
    master = history((1, 0), (2, 100), (4, 120))
    assert find_consistent_offset(replica, 260, master, 400) == 120


def test_same_epoch_with_different_starts_is_divergent_from_there() -> None:
    replica = history((1, 0), (2, 100), (3, 200))
    master = history((1, 0), (2, 120), (3, 200))
    # RocketMQ would trust epoch 3 (same start on both) and answer 300; the conflict in
    # epoch 2 means nothing from 100 on can be vouched for.
    assert find_consistent_offset(replica, 300, master, 350) == 100
    assert find_consistent_offset(master, 350, replica, 300) == 100


def test_different_starts_in_the_first_epoch_leave_nothing_in_common() -> None:
    assert find_consistent_offset(history((1, 0)), 50, history((1, 10)), 80) is None


def test_epoch_the_replica_never_saw_because_it_was_empty() -> None:
    # Epoch 2's master was deposed before writing; a copy never records an empty epoch.
    master = history((1, 0), (2, 100), (3, 100))
    replica = history((1, 0), (3, 100))
    assert find_consistent_offset(replica, 150, master, 200) == 150
    assert find_consistent_offset(master, 200, replica, 150) == 150


def test_elected_replica_that_never_wrote_shares_the_prefix() -> None:
    replica = history((1, 0), (5, 100))  # elected for epoch 5 at 100, deposed at once
    master = history((1, 0), (6, 80))
    assert find_consistent_offset(replica, 100, master, 300) == 80


@pytest.mark.parametrize(
    ("local", "local_max", "remote", "remote_max"),
    [
        ((), 0, (), 0),
        ((), 0, history((1, 0)), 100),  # a new replica
        ((), 70, history((1, 0)), 100),  # data but a lost epoch file: nothing vouches for it
        (history((1, 0)), 100, (), 0),
        (history((1, 0)), 100, history((2, 0)), 100),  # no epoch in common
        (history((3, 500)), 900, history((1, 0), (2, 400)), 1000),
    ],
)
def test_nothing_shared_gives_none(
    local: tuple[EpochEntry, ...], local_max: int, remote: tuple[EpochEntry, ...], remote_max: int
) -> None:
    assert find_consistent_offset(local, local_max, remote, remote_max) is None


def test_histories_that_break_the_rules_are_refused() -> None:
    with pytest.raises(ValueError):
        find_consistent_offset(history((1, 0), (2, 90)), 80, history((1, 0)), 100)
    with pytest.raises(ValueError):
        find_consistent_offset(history((1, 0)), 80, history((2, 0), (1, 5)), 100)


# -- find_consistent_offset: simulated clusters -------------------------------------------
#
# A log is modelled as one label per unit of offset: the epoch that wrote it. The controller
# gives each epoch to one broker, and a deposed master stops writing once it syncs with
# anyone, so (epoch, offset) names one byte: two logs agree exactly where their labels do.


@dataclass
class _Broker:
    log: list[int] = field(default_factory=list)
    entries: tuple[EpochEntry, ...] = ()
    zombie: bool = False
    """Was master and has not yet learnt otherwise: may still write in its last epoch."""


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class _Cluster:
    def __init__(self, rng: random.Random, size: int) -> None:
        self.rng = rng
        self.brokers = [_Broker() for _ in range(size)]
        self.master = 0
        self.epoch = 1
        self.brokers[0].entries = history((1, 0))

    def run(self, steps: int) -> None:
        for _ in range(steps):
            action = self.rng.choices(
                [self._write, self._zombie_write, self._sync, self._elect], [4, 1, 4, 1]
            )[0]
            action()

    def _write(self) -> None:
        self.brokers[self.master].log.extend([self.epoch] * self.rng.randint(1, 4))

    def _zombie_write(self) -> None:
        zombies = [b for b in self.brokers if b.zombie]
        if zombies:
            zombie = self.rng.choice(zombies)
            zombie.log.extend([zombie.entries[-1].epoch] * self.rng.randint(1, 3))

    def _elect(self) -> None:
        """Any broker may win, in sync or not (an unclean election)."""
        self.brokers[self.master].zombie = True
        self.master = self.rng.randrange(len(self.brokers))
        winner = self.brokers[self.master]
        self.epoch += self.rng.choice([1, 1, 2])
        winner.zombie = False
        winner.entries = appended(winner.entries, EpochEntry(self.epoch, len(winner.log)))

    def _sync(self) -> None:
        """A replica reconciles with the master (or, now and then, with a broker it has not
        yet learnt was deposed), then copies some of its log."""
        others = [i for i in range(len(self.brokers)) if i != self.master]
        if not others:
            return
        replica = self.brokers[self.rng.choice(others)]
        source = self.brokers[self.master if self.rng.random() < 0.7 else self.rng.choice(others)]
        if replica is source:
            return
        agreed = find_consistent_offset(
            replica.entries, len(replica.log), source.entries, len(source.log)
        )
        assert (agreed or 0) == _common_prefix(replica.log, source.log)
        replica.zombie = False
        keep = agreed or 0
        del replica.log[keep:]
        replica.entries = truncated_from(replica.entries, keep) if agreed is not None else ()
        self._copy(replica, source, self.rng.randint(0, 6))

    @staticmethod
    def _copy(replica: _Broker, source: _Broker, units: int) -> None:
        starts = {entry.epoch: entry.start_offset for entry in source.entries}
        for offset in range(len(replica.log), min(len(source.log), len(replica.log) + units)):
            label = source.log[offset]
            if not replica.entries or replica.entries[-1].epoch != label:
                replica.entries = appended(replica.entries, EpochEntry(label, starts[label]))
            replica.log.append(label)


def _histories(cases: int, seed: int) -> list[_Cluster]:
    rng = random.Random(seed)
    clusters = []
    for _ in range(cases):
        cluster = _Cluster(rng, size=rng.randint(2, 4))
        cluster.run(rng.randint(1, 40))
        clusters.append(cluster)
    return clusters


def test_simulated_clusters_agree_exactly_where_their_logs_do() -> None:
    """Every sync inside the simulation asserts too; this adds every ordered pair at the end.

    With whole epoch files the epochs always determine the common prefix, so the answer is
    exact (and so never beyond it)."""
    pairs = 0
    for cluster in _histories(cases=2500, seed=20240611):
        for a in cluster.brokers:
            for b in cluster.brokers:
                agreed = find_consistent_offset(a.entries, len(a.log), b.entries, len(b.log))
                assert (agreed or 0) == _common_prefix(a.log, b.log)
                pairs += 1
    assert pairs > 10_000


def test_histories_missing_their_oldest_entries_never_claim_too_much() -> None:
    """Drop the oldest entries of either side (as housekeeping after retention would): the
    epochs may no longer determine the common prefix, but the answer never exceeds it."""
    rng = random.Random(7)
    short_of_truth = 0
    for cluster in _histories(cases=1500, seed=20240612):
        a, b = rng.sample(cluster.brokers, 2)
        local = a.entries[rng.randint(0, len(a.entries)) :]
        remote = b.entries[rng.randint(0, len(b.entries)) :]
        agreed = find_consistent_offset(local, len(a.log), remote, len(b.log))
        truth = _common_prefix(a.log, b.log)
        assert (agreed or 0) <= truth
        short_of_truth += (agreed or 0) < truth
    assert short_of_truth > 0  # the generator does reach the undeterminable cases


# -- the file format ----------------------------------------------------------------------

ENTRIES = history((1, 0), (2, 4096), (7, 4096), (12, 1_000_000_000_000))


def test_format_is_pinned() -> None:
    # The CRC-32 values were computed independently: zlib.crc32(b"1 0") and so on.
    assert encode_epoch_file(history((1, 0), (3, 4096))) == (
        b"capstan-epoch-file 1\n1 0 69b542bb\n3 4096 68f169e1\nend 2 5e8499ce\n"
    )


def test_round_trip() -> None:
    for entries in ((), ENTRIES[:1], ENTRIES):
        decoded = decode_epoch_file(encode_epoch_file(entries), "f")
        assert decoded.entries == entries
        assert decoded.torn_tail is None


def test_every_cut_of_a_file_keeps_a_prefix_and_is_noticed() -> None:
    raw = encode_epoch_file(ENTRIES)
    for length in range(len(raw)):
        decoded = decode_epoch_file(raw[:length], "f")
        assert decoded.entries == ENTRIES[: len(decoded.entries)]
        assert decoded.torn_tail is not None
    # Each entry survives once its line end is on disk.
    line_ends = [i + 1 for i, byte in enumerate(raw) if byte == ord("\n")]
    for kept, end in enumerate(line_ends[1:-1], start=1):
        assert decode_epoch_file(raw[:end], "f").entries == ENTRIES[:kept]


@pytest.mark.parametrize("damage", ["xor1", "xor20", "newline", "zero"])
def test_damage_anywhere_never_yields_wrong_entries(damage: str) -> None:
    """Any one damaged byte either raises, or reads as a torn tail: a prefix of the entries
    and a warning. Damage within the end line keeps every entry; damage to the line end
    before it merges the two last lines into one bad last line, which a torn write could
    also have left, so the last entry goes."""
    raw = encode_epoch_file(ENTRIES)
    last_line_at = raw.rindex(b"\n", 0, len(raw) - 1) + 1
    for position in range(len(raw)):
        broken = bytearray(raw)
        broken[position] = {
            "xor1": raw[position] ^ 0x01,
            "xor20": raw[position] ^ 0x20,
            "newline": ord("\n"),
            "zero": 0,
        }[damage]
        if broken == raw:
            continue
        try:
            decoded = decode_epoch_file(bytes(broken), "f")
        except StoreCorruptError:
            # Only a damaged line with lines after it raises; a new line end splits one.
            assert position < last_line_at or damage == "newline"
            continue
        assert decoded.entries == ENTRIES[: len(decoded.entries)]
        assert decoded.torn_tail is not None
        if position >= last_line_at - 1:
            assert len(decoded.entries) >= len(ENTRIES) - (position == last_line_at - 1)


def test_lines_out_of_order_are_corrupt_even_at_the_end() -> None:
    raw = encode_epoch_file(history((1, 0), (2, 100)))
    lines = raw.split(b"\n")
    reordered = b"\n".join([lines[0], lines[2], lines[1], lines[3], b""])
    with pytest.raises(StoreCorruptError, match="line 3"):
        decode_epoch_file(reordered, "f")


def test_a_wrong_count_in_the_end_line_is_corrupt() -> None:
    one = encode_epoch_file(history((1, 0)))
    two = encode_epoch_file(history((1, 0), (2, 100)))
    spliced = two[: two.rindex(b"end")] + one[one.rindex(b"end") :]
    with pytest.raises(StoreCorruptError, match="counts 1 entries"):
        decode_epoch_file(spliced, "f")


def test_an_unknown_version_is_refused_by_name() -> None:
    raw = encode_epoch_file(ENTRIES).replace(b"capstan-epoch-file 1", b"capstan-epoch-file 2")
    with pytest.raises(StoreCorruptError, match="version '2'"):
        decode_epoch_file(raw, "f")


def test_corrupt_middle_names_the_file_and_line() -> None:
    raw = bytearray(encode_epoch_file(ENTRIES))
    raw[raw.index(b"4096")] = ord("5")
    with pytest.raises(StoreCorruptError, match=r"epochs line 3 is damaged \(checksum"):
        decode_epoch_file(bytes(raw), "epochs")


# -- EpochFile ----------------------------------------------------------------------------


def test_missing_file_is_an_empty_history(tmp_path: Path) -> None:
    epochs = EpochFile(tmp_path / "epoch")
    assert epochs.load() == ()
    assert epochs.entries() == ()
    assert epochs.last() is None
    assert epochs.torn_tail is None


def test_use_before_load_is_refused(tmp_path: Path) -> None:
    epochs = EpochFile(tmp_path / "epoch")
    with pytest.raises(RuntimeError, match="load"):
        epochs.append(1, 0)
    with pytest.raises(RuntimeError, match="load"):
        epochs.entries()


def test_appends_and_truncation_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store" / "epoch"
    epochs = EpochFile(path)
    epochs.load()
    epochs.append(1, 0)
    epochs.append(2, 100)
    epochs.append(4, 100)
    assert EpochFile(path).load() == history((1, 0), (2, 100), (4, 100))
    assert epochs.truncate_from(100) == 2
    assert epochs.truncate_from(100) == 0
    reopened = EpochFile(path)
    assert reopened.load() == history((1, 0))
    assert reopened.last() == EpochEntry(1, 0)
    assert not path.with_name("epoch.tmp").exists()


def test_a_refused_append_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "epoch"
    epochs = EpochFile(path)
    epochs.load()
    epochs.append(3, 50)
    before = path.read_bytes()
    for epoch, start in [(3, 60), (2, 60), (4, 49)]:
        with pytest.raises(ValueError):
            epochs.append(epoch, start)
    assert path.read_bytes() == before
    assert epochs.entries() == history((3, 50))


def test_truncation_that_drops_nothing_does_not_write(tmp_path: Path) -> None:
    path = tmp_path / "epoch"
    epochs = EpochFile(path)
    epochs.load()
    assert epochs.truncate_from(0) == 0
    assert not path.exists()


def test_torn_file_loads_its_prefix_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "epoch"
    raw = encode_epoch_file(ENTRIES)
    path.write_bytes(raw[: raw.index(b"7 4096") + 3])
    epochs = EpochFile(path)
    with caplog.at_level(logging.WARNING, "capstan.broker.replication.epoch_file"):
        assert epochs.load() == ENTRIES[:2]
    assert "torn tail" in caplog.text
    assert epochs.torn_tail is not None
    epochs.append(8, 5000)  # the next change rewrites the file whole
    assert decode_epoch_file(path.read_bytes(), "f").torn_tail is None
    reopened = EpochFile(path)
    assert reopened.load() == (*ENTRIES[:2], EpochEntry(8, 5000))
    assert reopened.torn_tail is None


def test_corrupt_file_raises_and_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "epoch"
    raw = encode_epoch_file(ENTRIES).replace(b"2 4096", b"2 4097", 1)
    path.write_bytes(raw)
    with pytest.raises(StoreCorruptError, match=str(path)):
        EpochFile(path).load()
    assert path.read_bytes() == raw
