"""One rule for every stored format: a newer Capstan moves data forward, an older one refuses.

Each kind of stored data has a format number, raised whenever what is on disk changes in a
way an older Capstan could misread: a broker's store (its directory holds `FORMAT`, a small
JSON file), the controller's state (a `format` field in its document, whichever backend
keeps it). Data from before the number existed is format 1.

On open:
- the same format: used as it is;
- an older one: the migrations from it to the current one run in order, each ending in a
  commit (the marker file rewritten, or the document written back with compare-and-swap).
  A migration leaves the old files in place until it returns, so a crash mid-way leaves the
  old format whole and the next start runs the migration again; migrations must therefore
  be safe to repeat;
- a newer one: refused with DataFormatTooNew, naming the version that wrote it (a downgrade
  would misread it; the way back is the newer Capstan, or a backup).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

from capstan import __version__
from capstan.common.durable_files import read_json_object, replace_durably
from capstan.common.errors import CapstanError

FORMAT_FILE = "FORMAT"
"""The marker in a data directory: {"kind", "format", "written_by"}."""
FORMAT_KEY = "format"
"""The field holding a JSON document's format."""
WRITTEN_BY_KEY = "written_by"
FIRST_FORMAT = 1
"""The format of data written before its kind had a number."""

DirectoryMigration = Callable[[pathlib.Path], None]
"""Moves a directory's contents from format N to N+1 in place (old files kept until done)."""
DocumentMigration = Callable[[dict[str, Any]], dict[str, Any]]
"""Returns a document of format N as format N+1."""


class DataFormatError(CapstanError):
    """Stored data that this Capstan must not use as it is."""

    retriable = False


class DataFormatTooNew(DataFormatError):
    """The data was written by a newer Capstan, in a format this one does not know."""


def _too_new(kind: str, where: str, found: int, current: int, written_by: str) -> str:
    return (
        f"{where} holds {kind} data in format {found}, written by Capstan "
        f"{written_by or 'of a newer version'}; this Capstan ({__version__}) reads formats up "
        f"to {current}. Run Capstan {written_by or 'of that version'} or newer on it: a "
        "downgrade would misread it (restore a backup taken before the upgrade to go back)."
    )


def _format_of(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < FIRST_FORMAT:
        raise DataFormatError(f"{where}: the format {value!r} is not a positive whole number")
    return value


def _chain(
    kind: str, found: int, current: int, migrations: Mapping[int, Any], where: str
) -> list[Any]:
    """The migrations from `found` to `current`, each keyed by the format it starts from."""
    missing = [n for n in range(found, current) if n not in migrations]
    if missing:
        raise DataFormatError(
            f"{where} holds {kind} data in format {found}, and this Capstan cannot move it "
            f"to format {current} (no migration from format {missing[0]})"
        )
    return [migrations[n] for n in range(found, current)]


def settle_directory(
    directory: pathlib.Path,
    kind: str,
    current: int,
    migrations: Mapping[int, DirectoryMigration],
) -> int:
    """Make `directory` hold `kind` data of format `current`: mark a new or an unmarked one,
    migrate an older one, refuse a newer one or another kind's. Returns the format found."""
    marker = directory / FORMAT_FILE
    stored = read_json_object(marker, DataFormatError)
    if stored is None:
        found, written_by = FIRST_FORMAT, ""
    else:
        if stored.get("kind") != kind:
            raise DataFormatError(
                f"{marker} says this directory holds {stored.get('kind')!r} data, not {kind}: "
                "is the path right?"
            )
        found = _format_of(stored.get(FORMAT_KEY), str(marker))
        written_by = str(stored.get(WRITTEN_BY_KEY) or "")
    if found > current:
        raise DataFormatTooNew(_too_new(kind, str(directory), found, current, written_by))
    for step, migrate in enumerate(_chain(kind, found, current, migrations, str(directory))):
        migrate(directory)
        _mark(marker, kind, found + step + 1)  # the commit of that step
    if stored is None:  # unmarked: new, or written before formats were numbered
        _mark(marker, kind, current)
    return found


def _mark(marker: pathlib.Path, kind: str, number: int) -> None:
    payload = {"kind": kind, FORMAT_KEY: number, WRITTEN_BY_KEY: __version__}
    replace_durably(marker, (json.dumps(payload, sort_keys=True) + "\n").encode())


def settle_document(
    document: dict[str, Any],
    kind: str,
    current: int,
    migrations: Mapping[int, DocumentMigration],
    where: str,
) -> dict[str, Any]:
    """`document` as format `current` (its `format` field set): an older one migrated in
    memory (the caller's next write commits it; the stored one stays as it was until then),
    a newer one refused. An empty document is new."""
    if not document:
        return {FORMAT_KEY: current, WRITTEN_BY_KEY: __version__}
    found = _format_of(document.get(FORMAT_KEY, FIRST_FORMAT), where)
    if found == current and FORMAT_KEY in document:
        return document  # as stored (read on every controller call: no copy)
    if found > current:
        written_by = str(document.get(WRITTEN_BY_KEY) or "")
        raise DataFormatTooNew(_too_new(kind, where, found, current, written_by))
    moved = dict(document)
    for migrate in _chain(kind, found, current, migrations, where):
        moved = migrate(moved)
    moved[FORMAT_KEY] = current
    moved[WRITTEN_BY_KEY] = __version__
    return moved
