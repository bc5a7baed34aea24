"""The stored-format rule: new data marked, older data migrated with the old files kept until
each step's commit, newer data (a downgrade) refused naming who wrote it."""

from __future__ import annotations

import json
import pathlib

import pytest

from capstan import __version__
from capstan.common.data_format import (
    FORMAT_FILE,
    DataFormatError,
    DataFormatTooNew,
    settle_directory,
    settle_document,
)


def marker(directory: pathlib.Path) -> dict[str, object]:
    return json.loads((directory / FORMAT_FILE).read_text())


def test_a_new_or_unmarked_directory_is_marked_with_the_current_format(tmp_path) -> None:
    (tmp_path / "data.txt").write_text("as an older Capstan left it")
    assert settle_directory(tmp_path, "thing", 1, {}) == 1
    assert marker(tmp_path) == {"kind": "thing", "format": 1, "written_by": __version__}
    assert (tmp_path / "data.txt").read_text() == "as an older Capstan left it"


def test_a_newer_format_is_refused_naming_the_version_that_wrote_it(tmp_path) -> None:
    stored = {"kind": "thing", "format": 3, "written_by": "0.3.0"}
    (tmp_path / FORMAT_FILE).write_text(json.dumps(stored))
    (tmp_path / "data.txt").write_text("format 3")
    with pytest.raises(DataFormatTooNew, match=r"format 3, written by Capstan 0\.3\.0.*up to 2"):
        settle_directory(tmp_path, "thing", 2, {1: lambda d: None})
    assert marker(tmp_path) == stored  # nothing touched
    assert (tmp_path / "data.txt").read_text() == "format 3"


def test_an_older_format_moves_forward_step_by_step_and_a_crash_keeps_the_old_files(
    tmp_path,
) -> None:
    (tmp_path / "table.txt").write_text("a,b")
    ran: list[int] = []

    def one_to_two(directory: pathlib.Path) -> None:
        ran.append(1)
        rows = (directory / "table.txt").read_text().split(",")
        (directory / "table.json").write_text(json.dumps(rows))

    def two_to_three_that_crashes(directory: pathlib.Path) -> None:
        ran.append(2)
        raise OSError("power lost mid-way")

    migrations = {1: one_to_two, 2: two_to_three_that_crashes}
    with pytest.raises(OSError):
        settle_directory(tmp_path, "thing", 3, migrations)
    # Step 1 committed, step 2 not: the marker says 2 and step 1's input is still there.
    assert marker(tmp_path)["format"] == 2
    assert (tmp_path / "table.txt").exists()

    def two_to_three(directory: pathlib.Path) -> None:
        ran.append(3)
        (directory / "table.txt").unlink(missing_ok=True)  # the old file goes at the end

    migrations[2] = two_to_three
    assert settle_directory(tmp_path, "thing", 3, migrations) == 2
    assert ran == [1, 2, 3]  # step 1 is not run again
    assert marker(tmp_path)["format"] == 3
    assert json.loads((tmp_path / "table.json").read_text()) == ["a", "b"]
    assert settle_directory(tmp_path, "thing", 3, migrations) == 3
    assert ran == [1, 2, 3]


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        ('{"kind": "other", "format": 1}', "holds 'other' data, not thing"),
        ('{"kind": "thing", "format": "two"}', "not a positive whole number"),
        ('{"kind": "thing", "form', "not valid JSON"),
        ("[1]", "holds list, not an object"),
    ],
)
def test_a_marker_that_is_wrong_or_torn_is_refused(tmp_path, content, complaint) -> None:
    (tmp_path / FORMAT_FILE).write_text(content)
    with pytest.raises(DataFormatError, match=complaint):
        settle_directory(tmp_path, "thing", 1, {})


def test_a_gap_in_the_migrations_is_refused_rather_than_skipped(tmp_path) -> None:
    (tmp_path / FORMAT_FILE).write_text('{"kind": "thing", "format": 1}')
    with pytest.raises(DataFormatError, match="no migration from format 2"):
        settle_directory(tmp_path, "thing", 3, {1: lambda d: None})
    assert marker(tmp_path)["format"] == 1  # nothing ran


def test_documents_follow_the_same_rule() -> None:
    assert settle_document({}, "doc", 2, {}, "here") == {"format": 2, "written_by": __version__}
    old = {"groups": {"g": 1}}  # written before formats were numbered: format 1
    moved = settle_document(old, "doc", 2, {1: lambda d: {**d, "brokers": {}}}, "here")
    assert moved == {"groups": {"g": 1}, "brokers": {}, "format": 2, "written_by": __version__}
    assert old == {"groups": {"g": 1}}  # the caller's copy, as stored, is untouched
    with pytest.raises(DataFormatTooNew, match="here holds doc data in format 3"):
        settle_document({"format": 3, "written_by": "9.9"}, "doc", 2, {}, "here")
