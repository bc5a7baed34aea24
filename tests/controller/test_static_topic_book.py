"""The controller's book of static topics, over the file state store: a change decided from
an epoch the book has left is refused, and the replica bookkeeping beside it is kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from capstan.common.queue_mapping import new_mapping, remap
from capstan.controller.state_store import FileStateStore
from capstan.controller.static_topic_book import MappingMoved, StaticTopicBook


def test_mappings_are_recorded_changed_from_their_epoch_and_forgotten(tmp_path: Path):
    store = FileStateStore(tmp_path)
    store.write({"groups": {"a": {"x": 1}}}, "")
    book = StaticTopicBook(store)
    first = new_mapping("Orders", 4, ["a", "b"])
    assert book.get("Orders") is None
    book.put(first, None)
    moved = remap(first, 0, "b", old_end=3, new_start=0, to_queue_id=0)
    with pytest.raises(MappingMoved, match="is at epoch 1, not None"):
        book.put(moved, None)  # someone else created it meanwhile
    book.put(moved, 1)
    with pytest.raises(MappingMoved, match="is at epoch 2, not 1"):
        book.put(remap(first, 1, "b", old_end=0, new_start=0, to_queue_id=1), 1)
    book.put(new_mapping("Audit", 1, ["a"]), None)
    again = StaticTopicBook(FileStateStore(tmp_path))
    assert again.get("Orders") == moved
    assert [m.topic for m in again.all()] == ["Audit", "Orders"]
    assert store.read().document["groups"] == {"a": {"x": 1}}  # left as it was
    assert again.delete("Orders") and not again.delete("Orders")
    assert again.get("Orders") is None
