"""The checkpoint, the abort file and the lock file: how a store knows its own state.

- `checkpoint`: how far the CommitLog, consume queues and index are known durable
  (format.CHECKPOINT), rewritten atomically; a torn or missing one reads as None, and
  recovery then validates the whole CommitLog.
- `abort`: exists while the store is open. Found at open, it means the last run crashed.
- `lock`: an flock held while open, so a second process cannot open the same store.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pathlib
import time
from dataclasses import dataclass

from capstan.broker.store import format as fmt
from capstan.common.durable_files import replace_durably, sync_directory
from capstan.common.errors import StoreLockedError

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint"
ABORT_FILE = "abort"
LOCK_FILE = "lock"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    commitlog_flushed_offset: int
    queues_durable_offset: int
    index_durable_offset: int
    written_at_ms: int = 0

    @property
    def redispatch_from(self) -> int:
        """Where recovery starts: below this, log, queues and index are all durable."""
        return min(
            self.commitlog_flushed_offset, self.queues_durable_offset, self.index_durable_offset
        )


def read_checkpoint(root: pathlib.Path) -> Checkpoint | None:
    """The stored checkpoint, or None if it is missing or fails its CRC."""
    path = root / CHECKPOINT_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) != fmt.CHECKPOINT.size:
        log.warning(
            "checkpoint %s has %d bytes, expected %d; ignoring it",
            path,
            len(raw),
            fmt.CHECKPOINT.size,
        )
        return None
    magic, version, flushed, queues, index, written, crc = fmt.CHECKPOINT.unpack(raw)
    if (
        magic != fmt.CHECKPOINT_MAGIC
        or crc != fmt.crc32(raw[:-4])
        or version != fmt.CHECKPOINT_VERSION
    ):
        log.warning("checkpoint %s is damaged; ignoring it", path)
        return None
    return Checkpoint(flushed, queues, index, written)


def write_checkpoint(root: pathlib.Path, checkpoint: Checkpoint) -> None:
    """Replace the checkpoint atomically (temp file, fsync, rename, fsync directory)."""
    body = fmt.CHECKPOINT.pack(
        fmt.CHECKPOINT_MAGIC,
        fmt.CHECKPOINT_VERSION,
        checkpoint.commitlog_flushed_offset,
        checkpoint.queues_durable_offset,
        checkpoint.index_durable_offset,
        checkpoint.written_at_ms or int(time.time() * 1000),
        0,
    )[:-4]
    replace_durably(root / CHECKPOINT_FILE, body + fmt.crc32(body).to_bytes(4, "big"))


def crashed_last_time(root: pathlib.Path) -> bool:
    return (root / ABORT_FILE).exists()


def mark_open(root: pathlib.Path) -> None:
    """Create the abort file durably; `mark_clean_close` removes it."""
    (root / ABORT_FILE).write_text(f"{os.getpid()}\n")
    sync_directory(root)


def mark_clean_close(root: pathlib.Path) -> None:
    (root / ABORT_FILE).unlink(missing_ok=True)
    sync_directory(root)


class StoreLock:
    """An exclusive flock on `<root>/lock`, released when the holder closes or dies."""

    def __init__(self, root: pathlib.Path) -> None:
        self.path = root / LOCK_FILE
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            raise StoreLockedError(
                f"store {root} is already open in another process (pid {holder}); "
                "stop that process first"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


QUEUE_TABLE_FILE = "queue_table.json"


def write_queue_table(root: pathlib.Path, table: dict[tuple[str, int], int]) -> None:
    """Record each queue's end offset as of a checkpoint, so recovery notices a consume
    queue that lost units even when no later message of that queue would reveal it."""
    data = json.dumps({f"{t}/{q}": end for (t, q), end in sorted(table.items())}).encode()
    replace_durably(root / QUEUE_TABLE_FILE, data)


def read_queue_table(root: pathlib.Path) -> dict[tuple[str, int], int]:
    try:
        raw = json.loads((root / QUEUE_TABLE_FILE).read_bytes())
    except FileNotFoundError:
        return {}
    except ValueError:
        log.warning(
            "%s is damaged; consume queues are checked against the log only",
            root / QUEUE_TABLE_FILE,
        )
        return {}
    table: dict[tuple[str, int], int] = {}
    for key, end in raw.items():
        topic, _, queue = key.rpartition("/")
        table[(topic, int(queue))] = int(end)
    return table
