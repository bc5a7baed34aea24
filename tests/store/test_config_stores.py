"""The broker's config stores survive restarts and torn files, and refuse bad values by name."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

from capstan.broker.store.atomic_file import AtomicJsonFile
from capstan.broker.store.consumer_offsets import ConsumerOffsetStore
from capstan.broker.store.subscription_groups import (
    SubscriptionGroupConfig,
    SubscriptionGroupStore,
)
from capstan.broker.store.topic_config import (
    PERM_READ,
    PERM_WRITE,
    MessageType,
    TopicConfig,
    TopicConfigStore,
    validate_topic_name,
)
from capstan.common.errors import ConfigError, StoreCorruptError


def damage(path: Path, how: str) -> None:
    """Break a JSON file the way a crash or a bad disk would."""
    raw = path.read_bytes()
    if how == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "flip":
        # Flipping the opening brace's bits turns it into a byte no JSON value starts with.
        path.write_bytes(bytes([raw[0] ^ 0xFF]) + raw[1:])
    else:
        path.write_bytes(b"[1, 2]")


def backup_of(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


# --- AtomicJsonFile -------------------------------------------------------------------------


def test_load_of_a_never_saved_file_is_none(tmp_path: Path) -> None:
    assert AtomicJsonFile(tmp_path / "x.json").load() is None


def test_save_writes_sorted_indented_utf8_and_an_equal_backup(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "x.json"
    AtomicJsonFile(path).save({"b": 1, "a": "Zürich"})

    text = path.read_text(encoding="utf-8")
    assert text == '{\n  "a": "Zürich",\n  "b": 1\n}\n'
    assert backup_of(path).read_bytes() == path.read_bytes()
    assert AtomicJsonFile(path).load() == {"a": "Zürich", "b": 1}


@pytest.mark.parametrize("how", ["truncate", "flip", "not-an-object"])
def test_damaged_file_falls_back_to_the_last_save(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "x.json"
    store = AtomicJsonFile(path)
    store.save({"version": 1})
    store.save({"version": 2})
    damage(path, how)

    with caplog.at_level(logging.WARNING):
        assert AtomicJsonFile(path).load() == {"version": 2}
    assert str(path) in caplog.text


def test_missing_file_is_recovered_from_its_backup(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    AtomicJsonFile(path).save({"k": "v"})
    path.unlink()
    assert AtomicJsonFile(path).load() == {"k": "v"}


def test_damaged_file_and_damaged_backup_raise_naming_both(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    AtomicJsonFile(path).save({"k": "v"})
    damage(path, "truncate")
    damage(backup_of(path), "flip")

    with pytest.raises(StoreCorruptError) as raised:
        AtomicJsonFile(path).load()
    assert str(path) in str(raised.value)
    assert str(backup_of(path)) in str(raised.value)


def test_damaged_file_without_backup_raises(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(b'{"k": ')
    with pytest.raises(StoreCorruptError) as raised:
        AtomicJsonFile(path).load()
    assert str(path) in str(raised.value)


def test_leftover_tmp_files_are_ignored_then_removed_by_the_next_save(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    store = AtomicJsonFile(path)
    store.save({"k": 1})
    leftovers = [tmp_path / "x.json.tmp", tmp_path / "x.json.bak.tmp"]
    for leftover in leftovers:
        leftover.write_bytes(b'{"half": ')

    assert store.load() == {"k": 1}
    store.save({"k": 2})
    assert not any(leftover.exists() for leftover in leftovers)
    assert AtomicJsonFile(path).load() == {"k": 2}


# --- topics ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["orders", "a", "%RETRY%group-1", "%DLQ%g", "a|b_c", "x" * 127])
def test_valid_topic_names(name: str) -> None:
    assert validate_topic_name(name) is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [("", "empty"), ("x" * 128, "127"), ("a b", "characters"), ("t@g", "characters")],
)
def test_invalid_topic_names_say_why(name: str, expected: str) -> None:
    problem = validate_topic_name(name)
    assert problem is not None
    assert expected in problem
    with pytest.raises(ConfigError, match="name"):
        TopicConfig(name)


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"read_queue_nums": 1025}, "read_queue_nums"),
        ({"read_queue_nums": -1}, "read_queue_nums"),
        ({"write_queue_nums": 2000}, "write_queue_nums"),
        ({"read_queue_nums": 0, "write_queue_nums": 0}, "both 0"),
        ({"perm": 8}, "perm"),
        ({"perm": -1}, "perm"),
        ({"attributes": {"k": 1}}, "attributes"),
    ],
)
def test_bad_topic_values_are_refused_by_field(kwargs: dict[str, object], field_name: str) -> None:
    with pytest.raises(ConfigError, match=field_name):
        TopicConfig("orders", **kwargs)  # type: ignore[arg-type]


def test_topic_permissions_and_queue_dirs() -> None:
    assert TopicConfig("t").perm == PERM_READ | PERM_WRITE
    read_only = TopicConfig("t", perm=PERM_READ, read_queue_nums=4, write_queue_nums=16)
    assert read_only.readable
    assert not read_only.writable
    assert read_only.queue_dir_count == 16
    shrinking = TopicConfig("t", read_queue_nums=8, write_queue_nums=0)
    assert shrinking.queue_dir_count == 8


def test_topic_json_round_trip_uses_camel_case() -> None:
    config = TopicConfig("t", 4, 2, 6, MessageType.FIFO, {"cleanup.policy": "compact"})
    as_dict = config.to_dict()
    assert as_dict == {
        "topicName": "t",
        "readQueueNums": 4,
        "writeQueueNums": 2,
        "perm": 6,
        "messageType": "FIFO",
        "attributes": {"cleanup.policy": "compact"},
    }
    assert TopicConfig.from_dict(as_dict) == config


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"topicName": "t", "readQueueNum": 4}, "readQueueNum"),
        ({"topicName": "t", "messageType": "BULK"}, "messageType"),
        ({"topicName": "t", "writeQueueNums": "8"}, "write_queue_nums"),
        ({"readQueueNums": 4}, "topicName"),
    ],
)
def test_topic_from_dict_names_the_bad_key(data: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        TopicConfig.from_dict(data)


def test_stored_topic_is_not_changed_through_the_callers_dict(tmp_path: Path) -> None:
    attributes = {"k": "v"}
    store = TopicConfigStore(tmp_path / "topics.json")
    store.put(TopicConfig("t", attributes=attributes))
    attributes["k"] = "changed"
    stored = store.get("t")
    assert stored is not None
    assert stored.attributes == {"k": "v"}


def test_topics_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    store = TopicConfigStore(path)
    store.put(TopicConfig("orders", 16, 16, message_type=MessageType.TRANSACTION))
    store.put(TopicConfig("audit", perm=PERM_READ))
    store.put(TopicConfig("orders", 16, 32))

    reopened = TopicConfigStore(path)
    assert reopened.names() == ["audit", "orders"]
    assert reopened.get("orders") == TopicConfig("orders", 16, 32)
    assert reopened.all() == [TopicConfig("audit", perm=PERM_READ), TopicConfig("orders", 16, 32)]
    assert "audit" in reopened
    assert "missing" not in reopened
    assert reopened.get("missing") is None
    assert reopened.data_version == 3


def test_topic_delete_is_persisted_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    store = TopicConfigStore(path)
    store.put(TopicConfig("t"))
    assert store.delete("t") is True
    assert store.delete("t") is False
    assert TopicConfigStore(path).names() == []
    assert TopicConfigStore(path).data_version == 2


def test_putting_an_identical_topic_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    store = TopicConfigStore(path)
    store.put(TopicConfig("t"))
    inode = path.stat().st_ino
    store.put(TopicConfig("t"))
    assert store.data_version == 1
    assert path.stat().st_ino == inode


def test_torn_topics_file_recovers_the_previous_save(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    store = TopicConfigStore(path)
    store.put(TopicConfig("first"))
    previous_backup = backup_of(path).read_bytes()
    store.put(TopicConfig("second"))
    # A crash after the main file was replaced but before the backup was: the backup lags.
    backup_of(path).write_bytes(previous_backup)
    damage(path, "truncate")

    reopened = TopicConfigStore(path)
    assert reopened.names() == ["first"]
    assert reopened.data_version == 1


def test_invalid_topic_in_the_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    entry = {"topicName": "t", "readQueueNums": 5000}
    path.write_text(json.dumps({"topicConfigTable": {"t": entry}, "dataVersion": 1}))
    with pytest.raises(ConfigError, match="read_queue_nums") as raised:
        TopicConfigStore(path)
    assert str(path) in str(raised.value)


# --- subscription groups --------------------------------------------------------------------


def test_groups_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "subscriptionGroup.json"
    store = SubscriptionGroupStore(path)
    fifo = SubscriptionGroupConfig("billing", consume_message_orderly=True, retry_max_times=3)
    store.put(fifo)
    store.put(SubscriptionGroupConfig("audit", consume_enable=False, attributes={"a": "b"}))
    store.put(SubscriptionGroupConfig("gone"))
    assert store.delete("gone")

    reopened = SubscriptionGroupStore(path)
    assert reopened.names() == ["audit", "billing"]
    assert reopened.get("billing") == fifo
    assert [g.group_name for g in reopened.all()] == ["audit", "billing"]
    assert reopened.data_version == 4
    assert "gone" not in reopened


def test_group_names_may_be_longer_than_topic_names() -> None:
    assert SubscriptionGroupConfig("g" * 255).group_name == "g" * 255
    with pytest.raises(ConfigError, match=r"group name .*255"):
        SubscriptionGroupConfig("g" * 256)
    with pytest.raises(ConfigError, match="group name"):
        SubscriptionGroupConfig("my group")


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"retry_max_times": 65}, "retry_max_times"),
        ({"retry_max_times": -1}, "retry_max_times"),
        ({"retry_queue_nums": 0}, "retry_queue_nums"),
        ({"consume_enable": "yes"}, "consume_enable"),
    ],
)
def test_bad_group_values_are_refused_by_field(kwargs: dict[str, object], field_name: str) -> None:
    with pytest.raises(ConfigError, match=field_name):
        SubscriptionGroupConfig("g", **kwargs)  # type: ignore[arg-type]


def test_group_retry_limits_at_the_edges_are_accepted() -> None:
    assert SubscriptionGroupConfig("g", retry_max_times=0).retry_max_times == 0
    assert SubscriptionGroupConfig("g", retry_max_times=64).retry_max_times == 64


def test_torn_groups_file_falls_back_to_backup(tmp_path: Path) -> None:
    path = tmp_path / "subscriptionGroup.json"
    SubscriptionGroupStore(path).put(SubscriptionGroupConfig("g", retry_max_times=5))
    damage(path, "flip")
    assert SubscriptionGroupStore(path).get("g") == SubscriptionGroupConfig("g", retry_max_times=5)


# --- consumer offsets -----------------------------------------------------------------------


def test_offsets_commit_query_and_reload(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    store = ConsumerOffsetStore(path)
    assert store.query("g", "t", 0) is None
    store.commit("g", "t", 0, 100)
    store.commit("g", "t", 1, 7)
    store.commit("g", "t", 0, 40)  # a reset moves it back
    store.commit("other", "t", 0, 5)
    assert store.persist() is True

    reopened = ConsumerOffsetStore(path)
    assert reopened.query("g", "t", 0) == 40
    assert reopened.offsets_of_group("g") == {("t", 0): 40, ("t", 1): 7}
    assert reopened.groups() == ["g", "other"]
    assert reopened.query("g", "t", 2) is None


def test_offsets_file_uses_rocketmq_layout(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    store = ConsumerOffsetStore(path)
    store.commit("g", "%RETRY%g", 3, 12)
    store.persist()
    assert json.loads(path.read_text()) == {
        "offsetTable": {"%RETRY%g@g": {"3": 12}},
        "dataVersion": 1,
    }


def test_persist_writes_only_after_a_change(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    store = ConsumerOffsetStore(path)
    assert store.persist() is False
    assert not path.exists()

    store.commit("g", "t", 0, 1)
    assert store.persist() is True
    inode = path.stat().st_ino
    assert store.persist() is False
    store.commit("g", "t", 0, 1)  # the same value again is not a change
    assert store.persist() is False
    assert path.stat().st_ino == inode

    store.commit("g", "t", 0, 2)
    assert store.persist() is True
    assert path.stat().st_ino != inode


def test_removing_groups_and_topics_is_persisted(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    store = ConsumerOffsetStore(path)
    store.commit("g1", "t", 0, 1)
    store.commit("g1", "u", 0, 2)
    store.commit("g2", "t", 0, 3)
    store.commit("g3", "u", 0, 4)
    assert store.remove_topic("t") is True
    assert store.remove_topic("t") is False
    assert store.remove_group("g3") is True
    assert store.remove_group("g3") is False
    store.persist()

    reopened = ConsumerOffsetStore(path)
    assert reopened.groups() == ["g1"]
    assert reopened.offsets_of_group("g1") == {("u", 0): 2}


@pytest.mark.parametrize(
    ("args", "field_name"),
    [
        (("g@x", "t", 0, 1), "group"),
        (("g", "", 0, 1), "topic"),
        (("g", "t", -1, 1), "queue_id"),
        (("g", "t", 0, -5), "offset"),
    ],
)
def test_bad_commits_are_refused_by_field(args: tuple[str, str, int, int], field_name: str) -> None:
    store = ConsumerOffsetStore(Path("/nonexistent/never-written.json"))
    with pytest.raises(ConfigError, match=field_name):
        store.commit(*args)


def test_torn_offsets_file_falls_back_to_backup(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    store = ConsumerOffsetStore(path)
    store.commit("g", "t", 0, 9)
    store.persist()
    damage(path, "truncate")
    assert ConsumerOffsetStore(path).query("g", "t", 0) == 9


def test_concurrent_commits_and_persists_keep_the_last_values(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    store = ConsumerOffsetStore(path)
    done = threading.Event()

    def consumer(worker: int) -> None:
        for offset in range(300):
            for queue_id in range(4):
                store.commit(f"g{worker % 2}", f"t{worker}", queue_id, offset + worker)

    def persister() -> None:
        while not done.is_set():
            store.persist()

    background = threading.Thread(target=persister)
    background.start()
    workers = [threading.Thread(target=consumer, args=(n,)) for n in range(8)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    done.set()
    background.join()
    store.persist()

    reopened = ConsumerOffsetStore(path)
    for worker in range(8):
        for queue_id in range(4):
            assert reopened.query(f"g{worker % 2}", f"t{worker}", queue_id) == 299 + worker
