"""The epoch file: which master epoch wrote which stretch of the CommitLog.

Every broker of a group keeps one (RocketMQ's `EpochFileCache`). An entry `(E, S)` says "the
master of epoch E began writing at CommitLog offset S"; it covers the bytes up to the next
entry's start, and the last entry covers the bytes up to the log's max offset. The controller
hands out each epoch once, so an epoch has one writer and every copy of its bytes is a prefix
of what that writer wrote. That is what lets a returning replica compare its history with the
master's (`find_consistent_offset`) and cut off the tail that no master of the group kept.

Who appends: a broker elected master appends `(new epoch, its max offset)` before its first
write; a replica appends the master's entry when the first bytes of a new epoch reach it.

Truncation order matters across a crash. Truncate the CommitLog first, then call
`truncate_from`: the reverse order could leave an entry stretching over bytes that were about
to be removed, and a later comparison would vouch for them. A crash between the two steps
leaves entries that start beyond the log; at start-up call `truncate_from(max_offset + 1)`.
"""

from __future__ import annotations

import logging
import re
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Final

from capstan.common.durable_files import replace_durably
from capstan.common.errors import StoreCorruptError

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------
# File format (ASCII text, every line ends in "\n")
#
#   capstan-epoch-file 1                  <- HEADER_LINE: name and format version
#   <epoch> <start_offset> <crc32>        <- ENTRY_LINE, one per entry, epochs ascending
#   ...
#   end <entry_count> <crc32>             <- END_LINE: the file is whole
#
# Numbers are decimal without sign or leading zeros; <crc32> is 8 lowercase hex digits of
# CRC-32 (zlib's polynomial) over the ASCII text before it on the same line, less the space
# ("<epoch> <start_offset>", "end <entry_count>"). Entries have strictly increasing epochs
# and non-decreasing start offsets.
#
# The file is replaced whole on every change (temp file, fsync, rename, fsync directory), so
# a torn file needs a filesystem that broke the rename's promise. A file that stops before
# its end line is torn: the whole, checksummed entries before the break are kept (a bad last
# line is dropped) and a warning is logged. The per-line CRCs are what make that prefix
# trustworthy; the end line is what makes a cut exactly at a line end visible. Damage that
# a torn write cannot explain (a bad line with lines after it, a wrong count, entries out of
# order) makes the file corrupt: loading raises StoreCorruptError rather than guess.
# --------------------------------------------------------------------------------------

HEADER_LINE: Final = "capstan-epoch-file 1"
ENTRY_LINE: Final = re.compile(r"(0|[1-9][0-9]*) (0|[1-9][0-9]*) ([0-9a-f]{8})")
END_LINE: Final = re.compile(r"end (0|[1-9][0-9]*) ([0-9a-f]{8})")
_HEADER_PREFIX: Final = "capstan-epoch-file "


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """The master of `epoch` began writing at CommitLog offset `start_offset` (bytes)."""

    epoch: int
    start_offset: int

    def __post_init__(self) -> None:
        if self.epoch < 0 or self.start_offset < 0:
            raise ValueError(f"epoch and start_offset must be non-negative: {self}")


@dataclass(frozen=True, slots=True)
class DecodedEpochFile:
    """What a file's bytes hold: its entries, and why a torn last line was dropped if one was."""

    entries: tuple[EpochEntry, ...]
    torn_tail: str | None = None


# -- pure rules over histories ----------------------------------------------------------


def check_history(entries: Sequence[EpochEntry], max_offset: int | None = None) -> None:
    """ValueError unless epochs strictly increase, starts never decrease, and (when given)
    no entry starts beyond `max_offset`: a comparison over a broken history would vouch for
    bytes nobody can vouch for."""
    for before, after in pairwise(entries):
        _check_successor(before, after)
    if max_offset is not None and entries and entries[-1].start_offset > max_offset:
        raise ValueError(f"{entries[-1]} starts beyond the log's max offset {max_offset}")


def _check_successor(last: EpochEntry | None, entry: EpochEntry) -> None:
    if last is None:
        return
    if entry.epoch <= last.epoch:
        raise ValueError(f"epoch {entry.epoch} does not follow epoch {last.epoch}")
    if entry.start_offset < last.start_offset:
        raise ValueError(
            f"epoch {entry.epoch} starts at {entry.start_offset}, before epoch {last.epoch}'s "
            f"start {last.start_offset}"
        )


def appended(entries: Sequence[EpochEntry], entry: EpochEntry) -> tuple[EpochEntry, ...]:
    """`entries` with `entry` added at the end; ValueError if it does not follow the last."""
    _check_successor(entries[-1] if entries else None, entry)
    return (*entries, entry)


def truncated_from(entries: Sequence[EpochEntry], offset: int) -> tuple[EpochEntry, ...]:
    """The entries that start before `offset`: those that remain once the log ends there.

    An entry starting exactly at `offset` goes too, since none of its bytes remain.
    """
    return tuple(entry for entry in entries if entry.start_offset < offset)


def entry_end(entries: Sequence[EpochEntry], index: int, max_offset: int) -> int:
    """Where the epoch of `entries[index]` stopped writing: the next entry's start, or the
    log's `max_offset` for the last entry."""
    if index + 1 < len(entries):
        return entries[index + 1].start_offset
    return max_offset


def find_consistent_offset(
    local: Sequence[EpochEntry],
    local_max_offset: int,
    remote: Sequence[EpochEntry],
    remote_max_offset: int,
) -> int | None:
    """The offset up to which both logs provably hold the same bytes; None if none is proven.

    As RocketMQ's `findConsistentPoint`: take the newest epoch both histories hold with the
    same start offset; its one writer wrote those bytes, and each log holds a prefix of them,
    so they agree up to the smaller of the epoch's two ends. Stricter than RocketMQ in one
    way: an epoch both hold with *different* starts means the histories disagree there, so
    no epoch at or after the first such conflict is trusted.

    None means no byte of the local log is vouched for: not even a prefix of it may be kept.
    A replica with an empty log just starts copying; one with data must drop its whole log
    and epoch file and copy again from the remote's first offset. Returning the remote's
    first start instead would keep local bytes below it that nothing ever compared.
    (RocketMQ refuses to continue replicating in this case; the caller chooses.)
    """
    check_history(local, local_max_offset)
    check_history(remote, remote_max_offset)
    remote_index = {entry.epoch: i for i, entry in enumerate(remote)}
    for i in reversed(range(_trusted_prefix(local, remote, remote_index))):
        j = remote_index.get(local[i].epoch)
        if j is not None and remote[j].start_offset == local[i].start_offset:
            local_end = entry_end(local, i, local_max_offset)
            return min(local_end, entry_end(remote, j, remote_max_offset))
    return None


def _trusted_prefix(
    local: Sequence[EpochEntry], remote: Sequence[EpochEntry], remote_index: dict[int, int]
) -> int:
    """How many local entries come before the first epoch both hold with different starts."""
    for i, entry in enumerate(local):
        j = remote_index.get(entry.epoch)
        if j is not None and remote[j].start_offset != entry.start_offset:
            return i
    return len(local)


# -- encoding ---------------------------------------------------------------------------


def encode_epoch_file(entries: Sequence[EpochEntry]) -> bytes:
    """The file's bytes for `entries` (see the format above)."""
    body = (f"{entry.epoch} {entry.start_offset}" for entry in entries)
    lines = [HEADER_LINE, *(_checked(text) for text in body), _checked(f"end {len(entries)}")]
    return "".join(line + "\n" for line in lines).encode("ascii")


def _checked(text: str) -> str:
    return f"{text} {_crc(text):08x}"


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("ascii"))


def decode_epoch_file(raw: bytes, where: str) -> DecodedEpochFile:
    """Parse a file's bytes; keep the whole prefix of a torn file, raise StoreCorruptError
    on damage a torn write cannot explain. `where` names the file in error messages."""
    lines = raw.split(b"\n")
    # The piece after the last "\n": empty for a whole file, else an unterminated line.
    unterminated = lines.pop()
    if unterminated:
        lines.append(unterminated)
    entries: list[EpochEntry] = []
    for number, line in enumerate(lines, start=1):
        is_last = number == len(lines)
        parsed = _parse_line(number, line, terminated=not (is_last and unterminated))
        if isinstance(parsed, _BadLine):
            if not is_last:
                raise _corrupt(where, number, parsed.reason)
            return DecodedEpochFile(tuple(entries), torn_tail=f"line {number}: {parsed.reason}")
        if isinstance(parsed, _EndLine):
            return _ended(entries, parsed.count, is_last, where, number)
        if parsed is not None:
            _append_parsed(entries, parsed, where, number)
    reason = "the file is empty" if not lines else "it stops before its end line"
    return DecodedEpochFile(tuple(entries), torn_tail=reason)


@dataclass(frozen=True, slots=True)
class _BadLine:
    reason: str


@dataclass(frozen=True, slots=True)
class _EndLine:
    count: int


def _corrupt(where: str, number: int, reason: str) -> StoreCorruptError:
    return StoreCorruptError(
        f"{where} line {number} is damaged ({reason}) and lines follow it, so the epoch "
        "history cannot be trusted; restore the file, or remove it together with the "
        "CommitLog so that this broker copies its log again from the master"
    )


def _ended(
    entries: list[EpochEntry], count: int, is_last: bool, where: str, number: int
) -> DecodedEpochFile:
    if not is_last:
        raise _corrupt(where, number, "an end line")
    if count != len(entries):
        raise StoreCorruptError(
            f"{where} line {number}: the end line counts {count} entries, the file holds "
            f"{len(entries)}"
        )
    return DecodedEpochFile(tuple(entries))


def _append_parsed(entries: list[EpochEntry], entry: EpochEntry, where: str, number: int) -> None:
    """A line whose checksum holds but that breaks the order was written wrong, not torn:
    corrupt even as the last line."""
    try:
        _check_successor(entries[-1] if entries else None, entry)
    except ValueError as exc:
        raise StoreCorruptError(f"{where} line {number}: {exc}") from None
    entries.append(entry)


def _parse_line(
    number: int, line: bytes, terminated: bool
) -> EpochEntry | _EndLine | _BadLine | None:
    """Line `number`'s entry or end mark, None for a good header, or why it is unusable."""
    if not terminated:
        return _BadLine("no line end")
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        return _BadLine("not ASCII text")
    if number == 1:
        return _check_header(text)
    if text.startswith("end "):
        return _parse_end(text)
    return _parse_entry(text)


def _check_header(text: str) -> _BadLine | None:
    if text == HEADER_LINE:
        return None
    if text.startswith(_HEADER_PREFIX):
        version = text.removeprefix(_HEADER_PREFIX)
        raise StoreCorruptError(f"epoch file format version {version!r} is not supported")
    return _BadLine(f"header is {text[:40]!r}, expected {HEADER_LINE!r}")


def _parse_entry(text: str) -> EpochEntry | _BadLine:
    match = ENTRY_LINE.fullmatch(text)
    if match is None:
        return _BadLine(f"not '<epoch> <start_offset> <crc32>': {text[:60]!r}")
    if int(match[3], 16) != _crc(f"{match[1]} {match[2]}"):
        return _BadLine("checksum mismatch")
    return EpochEntry(int(match[1]), int(match[2]))


def _parse_end(text: str) -> _EndLine | _BadLine:
    match = END_LINE.fullmatch(text)
    if match is None:
        return _BadLine(f"not 'end <entry_count> <crc32>': {text[:60]!r}")
    if int(match[2], 16) != _crc(f"end {match[1]}"):
        return _BadLine("checksum mismatch")
    return _EndLine(int(match[1]))


# -- the file ---------------------------------------------------------------------------


class EpochFile:
    """A broker's epoch history on disk; thread-safe.

    Call `load()` once before anything else: until then there is no history in memory, and
    writing one would overwrite the file's entries. Each change is on disk before it shows
    in memory, so a failed write leaves both as they were.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._entries: tuple[EpochEntry, ...] | None = None
        self._torn_tail: str | None = None

    @property
    def path(self) -> Path:
        return self._path

    @property
    def torn_tail(self) -> str | None:
        """Why the last `load()` dropped a torn tail, or None if the file was whole.

        After a torn load, entries may be missing at the end, so the last entry may seem to
        cover bytes that a later, forgotten epoch wrote. Until the log has been reconciled,
        compare with `local_max_offset` = the last entry's start (0 with no entry), never
        the log's real end: that vouches for nothing the lost entries described.
        """
        with self._lock:
            return self._torn_tail

    def load(self) -> tuple[EpochEntry, ...]:
        """Read the file (a missing one is an empty history) and return its entries.

        A torn tail is dropped with a warning and reported by `torn_tail`; the file is left
        as it is and the next change rewrites it whole. Raises StoreCorruptError on damage a
        torn write cannot explain.
        """
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            raw = None
        decoded = DecodedEpochFile(()) if raw is None else decode_epoch_file(raw, str(self._path))
        if decoded.torn_tail is not None:
            log.warning(
                "epoch file %s has a torn tail (%s); keeping its %d whole entries",
                self._path,
                decoded.torn_tail,
                len(decoded.entries),
            )
        with self._lock:
            self._entries, self._torn_tail = decoded.entries, decoded.torn_tail
        return decoded.entries

    def entries(self) -> tuple[EpochEntry, ...]:
        with self._lock:
            return self._loaded_locked()

    def last(self) -> EpochEntry | None:
        with self._lock:
            entries = self._loaded_locked()
            return entries[-1] if entries else None

    def append(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch` began at `start_offset`; durable on return.

        ValueError unless `epoch` is above the last epoch and `start_offset` is not below
        the last start.
        """
        with self._lock:
            self._append_locked(EpochEntry(epoch, start_offset))

    def truncate_from(self, offset: int) -> int:
        """Drop the entries starting at or after `offset`, durably; how many were dropped.

        Call after the CommitLog itself was cut at `offset` (see the module docstring).
        """
        with self._lock:
            return self._truncate_from_locked(offset)

    def _append_locked(self, entry: EpochEntry) -> None:
        self._save_locked(appended(self._loaded_locked(), entry))

    def _truncate_from_locked(self, offset: int) -> int:
        entries = self._loaded_locked()
        kept = truncated_from(entries, offset)
        if len(kept) != len(entries):
            self._save_locked(kept)
        return len(entries) - len(kept)

    def _save_locked(self, entries: tuple[EpochEntry, ...]) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        replace_durably(self._path, encode_epoch_file(entries))
        self._entries = entries

    def _loaded_locked(self) -> tuple[EpochEntry, ...]:
        if self._entries is None:
            raise RuntimeError(f"EpochFile {self._path}: call load() first")
        return self._entries
