"""A broker's copy of its static topics' mappings: newer epochs win, and it is durable."""

from __future__ import annotations

from pathlib import Path

import pytest

from capstan.broker.store.queue_mappings import QueueMappingStore
from capstan.common.errors import ConfigError
from capstan.common.queue_mapping import MappingError, new_mapping, remap


def test_a_newer_mapping_replaces_the_held_one_and_an_older_one_changes_nothing(tmp_path: Path):
    store = QueueMappingStore(tmp_path / "queueMappings.json")
    first = new_mapping("Orders", 4, ["a", "b"])
    moved = remap(first, 1, "a", old_end=5, new_start=0, to_queue_id=1)
    assert store.adopt(first) == first
    assert store.adopt(moved) == moved
    assert store.adopt(first) == moved  # a late hand-over of the older one
    assert store.get("Orders") == moved and store.names() == ["Orders"]
    reopened = QueueMappingStore(tmp_path / "queueMappings.json")
    assert reopened.get("Orders") == moved


def test_two_mappings_of_one_epoch_that_differ_are_refused(tmp_path: Path):
    store = QueueMappingStore(tmp_path / "queueMappings.json")
    store.adopt(new_mapping("Orders", 4, ["a", "b"]))
    assert store.adopt(new_mapping("Orders", 4, ["a", "b"])) is not None  # the same: fine
    with pytest.raises(MappingError, match="a different mapping with epoch 1 is held already"):
        store.adopt(new_mapping("Orders", 4, ["b", "a"]))
    assert store.get("Orders") == new_mapping("Orders", 4, ["a", "b"])


def test_a_torn_or_hand_edited_file_is_refused_naming_the_problem(tmp_path: Path):
    path = tmp_path / "queueMappings.json"
    path.write_text(
        '{"dataVersion": 1, "topicQueueMappings": {"Orders": {"topic": "Orders", '
        '"epoch": 1, "queues": [[{"gen": 0, "group": "a", "queueId": 0, '
        '"logicOffset": 0, "startOffset": 0, "endOffset": 9}]]}}}'
    )
    with pytest.raises(ConfigError, match="logic queue 0, item 0: the last item must be open"):
        QueueMappingStore(path)
