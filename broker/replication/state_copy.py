"""What of a broker's state beyond its CommitLog a master sends its slaves (the Metadata
message), and how a slave takes it: topics, subscription groups, consumer offsets, pop
state, timer and transaction progress, queue locks, the receipt-handle key, and the
generations of compacted copies (a slave with an older copy fetches the master's:
slave_stream.py).

Each part has a version that rises when it changes; the master sends a part when its
version differs from the one last sent on that stream (everything on a new stream). The
pop state, changed by every receive and ack, goes as the journal lines written since the
version last sent (whole when those are no longer kept, or when the slave asks for it
having skipped Metadata on the stream). The
slave stores each part as its own, durably, so once promoted it serves offsets, in-flight
pop messages and receipt handles as the master did, and its timer and transaction checks
go on from the master's progress (re-delivering at most what the master did after its
last progress record).

Replication knows no service: each part is contributed as a `StatePart` (its field of the
Metadata message, its version, how to export and adopt it), built by the broker that owns
the services (broker.py), and the receipt-handle key as a `HandleKey`.

Without a controller the same document travels back: a slave that acted for an absent
master (slave-acting-master) hands the master what it changed (`taken_back`), and the
master adopts it before serving (`apply_files` and `apply_services` again).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from capstan.v1 import replication_pb2 as pb

Versions = tuple[int, ...]
"""Each part's version, in the order of the parts."""


@dataclass(frozen=True)
class StatePart:
    """One part of a broker's state a master copies to its slaves, as JSON in the Metadata
    field `field`."""

    field: str
    version: Callable[[], int]
    export: Callable[[], Any]
    """The part as a JSON-able document."""
    adopt: Callable[[Any], None] | None
    """Take the master's document as this broker's own (durably); None for a part the
    slave handles itself (the compacted copies, which it fetches)."""
    on_loop: bool = False
    """Whether adopting touches state the event loop owns (else it runs on a worker thread:
    it only writes files)."""
    master_only: bool = False
    """Changed by the master alone, so never taken back from a slave that acted for it."""
    changes_since: Callable[[int], str | None] | None = None
    """For a part that changes often a little (the pop state): its changes after a version,
    as text, or None when they are no longer kept. A stream sends these, in the field
    `changes_field`, rather than the whole part, once the slave holds the whole part."""
    changes_field: str = ""
    adopt_changes: Callable[[str], None] | None = None
    """Take the master's changes (`changes_since`) as changes of this broker's own."""


class HandleKey(Protocol):
    """The key receipt handles are signed with: a slave takes the master's, so handles the
    master issued stay valid once it is promoted."""

    @property
    def key(self) -> bytes: ...

    def adopt_key(self, key: bytes) -> None: ...


class BrokerStateCopy:
    def __init__(self, parts: Sequence[StatePart], handles: HandleKey) -> None:
        fields = [p.field for p in parts]
        known = set(pb.Metadata.DESCRIPTOR.fields_by_name)
        if len(set(fields)) != len(fields) or not set(fields) <= known:
            raise ValueError(f"state parts must name distinct Metadata fields, got {fields}")
        self._parts = tuple(parts)
        self._handles = handles

    def versions(self) -> Versions:
        return tuple(p.version() for p in self._parts)

    def metadata(self, sent: Versions | None, current: Versions) -> pb.Metadata:
        """The parts whose versions moved since `sent` (all of them when None)."""
        changed = [sent is None or sent[i] != current[i] for i in range(len(current))]
        return self._document(changed, handle_key=sent is None, sent=sent)

    def taken_back(self) -> pb.Metadata:
        """What an acting master changes, for the returning master: every part but those
        only a master changes (and not the handle key)."""
        return self._document([not p.master_only for p in self._parts], handle_key=False)

    def _document(
        self, changed: list[bool], handle_key: bool, sent: Versions | None = None
    ) -> pb.Metadata:
        """The parts `changed`, whole, or as their changes after `sent` where a part
        keeps them."""
        found: dict[str, Any] = {}
        for i, (p, c) in enumerate(zip(self._parts, changed, strict=True)):
            if not c:
                continue
            changes = None
            if sent is not None and p.changes_since is not None:
                changes = p.changes_since(sent[i])
            if changes is not None:
                found[p.changes_field] = changes
            else:
                found[p.field] = json.dumps(p.export())
        if handle_key:
            found["handle_key"] = self._handles.key
        return pb.Metadata(**found)

    def apply_files(self, metadata: pb.Metadata) -> None:
        """The slave's part that writes files only (run it on a worker thread)."""
        self._apply(metadata, on_loop=False)
        if metadata.handle_key:
            self._handles.adopt_key(metadata.handle_key)

    def writes_files(self, metadata: pb.Metadata) -> bool:
        """Whether `metadata` carries anything for `apply_files` (most carry only the pop
        state's changes, applied on the loop: no thread is needed for them)."""
        if metadata.handle_key:
            return True
        return any(
            getattr(metadata, p.field) for p in self._parts if not p.on_loop and p.adopt is not None
        )

    def apply_services(self, metadata: pb.Metadata) -> None:
        """The slave's part that touches state the event loop owns (run it there)."""
        self._apply(metadata, on_loop=True)

    def _apply(self, metadata: pb.Metadata, on_loop: bool) -> None:
        for p in self._parts:
            if p.on_loop != on_loop:
                continue
            document = getattr(metadata, p.field)
            if p.adopt is not None and document:
                p.adopt(json.loads(document))
            changes = getattr(metadata, p.changes_field) if p.changes_field else ""
            if p.adopt_changes is not None and changes:
                p.adopt_changes(changes)

    def holds_whole(self, metadata: pb.Metadata) -> bool:
        """Whether `metadata` carries whole every part that could come as changes."""
        return all(getattr(metadata, p.field) for p in self._parts if p.changes_field)

    def drop_changes(self, metadata: pb.Metadata) -> None:
        """Take out of `metadata` the parts it carries as changes (for a slave that does
        not hold those parts as the master last sent them)."""
        for p in self._parts:
            if p.changes_field:
                metadata.ClearField(p.changes_field)
