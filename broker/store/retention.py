"""Retention: delete CommitLog segments by age and by disk usage, and follow with queues.

A segment is deleted when it was last written more than `file_reserved_hours` ago, or,
while the disk is fuller than `disk_max_used_ratio`, oldest first regardless of age. The
segment being written and the one before it are never deleted. Consume queues then move
their minimum past units whose message is gone, and index files wholly below the new
minimum go too; a reader below a minimum gets OFFSET_TOO_SMALL, never an exception.

Compact topics change both rules (`Floors`, from MessageStore.retention_floors): a record
of a compact topic that no compacted copy covers yet is kept whatever its age, so age
deletes only segments wholly below the first such record (the disk watermark still
deletes, oldest first, and says what it cost); and a segment whose every record is either
covered by a compacted copy or no longer in any queue goes at once, age or not: that is
how a compaction gives its disk space back.
"""

from __future__ import annotations

import logging
import os
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from capstan.broker.store.commitlog import CommitLog
from capstan.broker.store.consume_queue import ConsumeQueueStore
from capstan.broker.store.index import IndexService
from capstan.broker.store.segments import Segment

log = logging.getLogger(__name__)

DiskUsage = Callable[[pathlib.Path], float]


def used_ratio(figures: os.statvfs_result) -> float:
    """used / (used + available), the Use% that `df` shows.

    Blocks the filesystem reserves for root count as neither: they are not used, and this
    process (usually not root) may not write them. Counting them as used, as
    `1 - available / total` does, read 0.69 on a disk `df` showed 24 % full (a 60 %
    reserve), and the watermark deleted unread messages on a disk three quarters empty.
    """
    used = figures.f_blocks - figures.f_bfree
    usable = used + figures.f_bavail
    return used / usable if usable > 0 else 0.0


def disk_used_ratio(
    path: pathlib.Path, statvfs: Callable[[pathlib.Path], os.statvfs_result] = os.statvfs
) -> float:
    """The fraction of the filesystem holding `path` that is in use, as `df` shows it."""
    return used_ratio(statvfs(path))


@dataclass(frozen=True, slots=True)
class Floors:
    """CommitLog offsets retention must respect; None where nothing holds it back."""

    uncompacted: int | None
    """The first record of a compact topic that no compacted copy covers."""
    live: int | None
    """The first record any consume queue of a topic that is not compact still serves,
    or that is not dispatched yet (only computed while compacted copies exist)."""


NO_FLOORS = Floors(None, None)


@dataclass(frozen=True, slots=True)
class RetentionOutcome:
    segments_deleted: int
    bytes_freed: int
    new_min_offset: int
    reason: str


def expired_segments(
    commitlog: CommitLog,
    reserved_s: float,
    now_s: float,
    over_watermark: bool,
    floors: Floors = NO_FLOORS,
) -> list[tuple[str, Segment]]:
    """Segments to delete, oldest first, with the reason for each (a pure choice over mtimes
    and floors)."""
    candidates = commitlog.files.segments[:-2]
    chosen: list[tuple[str, Segment]] = []
    for segment in candidates:
        age_s = now_s - os.fstat(segment.fd).st_mtime
        end = segment.start + segment.length()
        below_uncompacted = floors.uncompacted is None or end <= floors.uncompacted
        if below_uncompacted and floors.live is not None and end <= floors.live:
            chosen.append(("superseded by compaction", segment))
        elif age_s > reserved_s and below_uncompacted:
            chosen.append(("expired", segment))
        elif over_watermark:
            chosen.append(("disk usage over watermark", segment))
            break  # one at a time when forced, then usage is measured again
        else:
            break
    return chosen


class RetentionService:
    """One retention round at a time; the store calls `run_once` from its clean routine."""

    def __init__(
        self,
        commitlog: CommitLog,
        queues: ConsumeQueueStore,
        index: IndexService | None,
        reserved_hours: float,
        max_used_ratio: float,
        disk_usage: DiskUsage = disk_used_ratio,
        floors: Callable[[], Floors] = lambda: NO_FLOORS,
    ) -> None:
        self.commitlog = commitlog
        self.queues = queues
        self.index = index
        self.reserved_s = reserved_hours * 3600
        self.max_used_ratio = max_used_ratio
        self.disk_usage = disk_usage
        self.floors = floors

    def run_once(self, now_s: float | None = None) -> RetentionOutcome:
        now_s = time.time() if now_s is None else now_s
        # Descriptors of segments deleted last round: any read that held one has finished.
        self.commitlog.files.release_retired()
        for queue in self.queues:
            queue.files.release_retired()
        deleted, freed, reasons = 0, 0, set()
        floors = self.floors()
        while True:
            over = self.disk_usage(self.commitlog.files.directory) > self.max_used_ratio
            chosen = expired_segments(self.commitlog, self.reserved_s, now_s, over, floors)
            if not chosen:
                break
            for reason, segment in chosen:
                end = segment.start + segment.length()
                if floors.uncompacted is not None and end > floors.uncompacted:
                    log.warning(
                        "retention: the disk is over its watermark; deleting %s although it "
                        "holds records of a compact topic that no compaction has covered",
                        segment.path.name,
                    )
                freed += segment.length()
                log.info("retention: deleting CommitLog segment %s (%s)", segment.path.name, reason)
                self.commitlog.files.remove(segment)
                deleted += 1
                reasons.add(reason)
            if not over:
                break
        new_min = self.commitlog.min_offset
        if deleted:
            self._follow(new_min)
        return RetentionOutcome(deleted, freed, new_min, ", ".join(sorted(reasons)))

    def _follow(self, commitlog_min: int) -> None:
        for queue in self.queues:
            queue.drop_below_phys(commitlog_min)
        if self.index is not None:
            self.index.delete_files_below(commitlog_min)
