"""Fixed-size segment files named by their 20-digit start offset.

The CommitLog and every ConsumeQueue are logical files cut into segments of equal size:
offset O lives in the segment starting at O - O % segment_bytes. Files hold only the bytes
written so far (no preallocation), so a file's length is where its data ends.
"""

from __future__ import annotations

import bisect
import logging
import os
import pathlib

from capstan.broker.store.format import segment_name
from capstan.common.durable_files import sync_directory

log = logging.getLogger(__name__)


class Segment:
    """One segment file: a start offset and an open file descriptor."""

    __slots__ = ("fd", "path", "start")

    def __init__(self, path: pathlib.Path, start: int, create: bool = False) -> None:
        self.path = path
        self.start = start
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self.fd = os.open(path, flags, 0o644)

    def length(self) -> int:
        return os.fstat(self.fd).st_size

    def read(self, position: int, size: int) -> bytes:
        """Up to `size` bytes from `position` within this segment (short at its end)."""
        return os.pread(self.fd, size, position)

    def write(self, position: int, data: bytes | memoryview) -> None:
        """Write all of `data` at `position`; a short write continues where it stopped."""
        view = memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, position)
            position += written
            view = view[written:]

    def truncate(self, length: int) -> None:
        os.ftruncate(self.fd, length)

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


class SegmentDirectory:
    """The segments of one logical file, kept sorted by start offset."""

    def __init__(self, directory: pathlib.Path, segment_bytes: int) -> None:
        if segment_bytes <= 0:
            raise ValueError("segment size must be positive")
        self.directory = directory
        self.segment_bytes = segment_bytes
        directory.mkdir(parents=True, exist_ok=True)
        self.segments: list[Segment] = []
        self._starts: list[int] = []
        self._retired: list[Segment] = []
        self._load()

    def _load(self) -> None:
        for path in sorted(self.directory.iterdir()):
            if not (path.name.isdigit() and len(path.name) == 20):
                continue
            start = int(path.name)
            if start % self.segment_bytes:
                log.warning(
                    "ignoring %s: not aligned to the segment size %d", path, self.segment_bytes
                )
                continue
            self.segments.append(Segment(path, start))
        self._starts = [s.start for s in self.segments]

    @property
    def first(self) -> Segment | None:
        return self.segments[0] if self.segments else None

    @property
    def last(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    def segment_start(self, offset: int) -> int:
        return offset - offset % self.segment_bytes

    def find(self, offset: int) -> Segment | None:
        """The segment holding `offset`, or None if that segment does not exist."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            return None
        segment = self.segments[i]
        return segment if offset < segment.start + self.segment_bytes else None

    def create(self, start: int) -> Segment:
        """Create (or reopen empty) the segment starting at `start`; it must come last."""
        if self.segments and start <= self.segments[-1].start:
            raise ValueError(f"segment {start} is not after {self.segments[-1].start}")
        segment = Segment(self.directory / segment_name(start), start, create=True)
        segment.truncate(0)
        self.segments.append(segment)
        self._starts.append(start)
        sync_directory(self.directory)
        return segment

    def remove(self, segment: Segment) -> None:
        """Delete a segment's file. Its descriptor stays open until `release_retired`,
        so a reader that already holds it finishes its read."""
        index = self.segments.index(segment)
        del self.segments[index]
        del self._starts[index]
        segment.path.unlink(missing_ok=True)
        self._retired.append(segment)

    def remove_from(self, offset: int) -> list[Segment]:
        """Delete every segment starting at or after `offset` (recovery of a torn tail)."""
        doomed = [s for s in self.segments if s.start >= offset]
        for segment in doomed:
            self.remove(segment)
        if doomed:
            sync_directory(self.directory)
        return doomed

    def release_retired(self) -> None:
        for segment in self._retired:
            segment.close()
        self._retired.clear()

    def close(self) -> None:
        for segment in self.segments:
            segment.close()
        self.segments.clear()
        self._starts.clear()
        self.release_retired()
