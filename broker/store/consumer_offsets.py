"""Committed consume offsets per (group, topic, queue), kept in memory and persisted on demand.

Consumers commit offsets every few seconds per queue, far too often to rewrite a file each
time, so commits only change memory and the broker calls `persist()` periodically and on
shutdown (RocketMQ's `ConsumerOffsetManager` does the same). `persist()` writes only when
something changed since the last write, so an idle broker does not fsync for nothing.

File layout, as RocketMQ's `consumerOffset.json`:
`{"offsetTable": {"<topic>@<group>": {"<queueId>": <offset>}}, "dataVersion": <int>}`.
Topic and group names never contain `@`, which is what makes that key unambiguous.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from capstan.broker.store.atomic_file import AtomicJsonFile, read_data_version
from capstan.common.errors import ConfigError

OFFSET_TABLE_KEY = "offsetTable"
_KEY_SEPARATOR = "@"

# group -> (topic, queue id) -> committed offset
_Table = dict[str, dict[tuple[str, int], int]]


class ConsumerOffsetStore:
    """Offsets per group, topic and queue id; thread-safe.

    `data_version` grows by one on each change in memory; `persist()` compares it with the
    version last written to decide whether a write is needed.
    """

    def __init__(self, path: Path) -> None:
        self._file = AtomicJsonFile(path)
        self._lock = threading.Lock()
        # Held across a whole persist so two persists never interleave their file writes and
        # a later snapshot is never overwritten by an earlier one; commits do not wait for it.
        self._persist_lock = threading.Lock()
        self._table, self._version = _load(self._file)
        self._persisted_version = self._version

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def data_version(self) -> int:
        with self._lock:
            return self._version

    def export(self) -> dict[str, Any]:
        """Every offset as the file holds them (what a master sends its slaves)."""
        with self._lock:
            return _encode(self._table, self._version)

    def replace_all(self, document: Mapping[str, Any], where: str) -> None:
        """Take over a master's `export()` (saved by the next `persist`). ConfigError
        (nothing changes) when the document is malformed."""
        table, version = _decode(document, where)
        with self._lock:
            self._table, self._version = table, max(version, self._version + 1)

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record `offset` as committed; the last write wins, so a reset may move it back."""
        _check_key_part("group", group)
        _check_key_part("topic", topic)
        _check_count("queue_id", queue_id)
        _check_count("offset", offset)
        with self._lock:
            queues = self._table.setdefault(group, {})
            if queues.get((topic, queue_id)) != offset:
                queues[topic, queue_id] = offset
                self._version += 1

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        """The committed offset, or None if the group never committed one for that queue."""
        with self._lock:
            return self._table.get(group, {}).get((topic, queue_id))

    def offsets_of_group(self, group: str) -> dict[tuple[str, int], int]:
        """A copy of the group's offsets, keyed by (topic, queue id)."""
        with self._lock:
            return dict(self._table.get(group, {}))

    def groups(self) -> list[str]:
        with self._lock:
            return sorted(self._table)

    def remove_group(self, group: str) -> bool:
        """Forget every offset of the group; False if it had none."""
        with self._lock:
            if self._table.pop(group, None) is None:
                return False
            self._version += 1
            return True

    def remove_topic(self, topic: str) -> bool:
        """Forget the offsets of every group on the topic; False if there were none."""
        with self._lock:
            return self._remove_topic_locked(topic)

    def persist(self) -> bool:
        """Write the table if it changed since the last write; True if it wrote."""
        with self._persist_lock:
            with self._lock:
                version = self._version
                if version == self._persisted_version:
                    return False
                document = _encode(self._table, version)
            self._file.save(document)
            with self._lock:
                self._persisted_version = version
            return True

    def _remove_topic_locked(self, topic: str) -> bool:
        removed = False
        for group in list(self._table):
            queues = self._table[group]
            doomed = [key for key in queues if key[0] == topic]
            for key in doomed:
                del queues[key]
            removed = removed or bool(doomed)
            if not queues:
                del self._table[group]
        if removed:
            self._version += 1
        return removed


def _check_key_part(kind: str, name: object) -> None:
    if not isinstance(name, str) or not name or _KEY_SEPARATOR in name:
        raise ConfigError(f"{kind} must be a non-empty name without '@', got {name!r}")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_count(field_name: str, value: object) -> None:
    if not _is_count(value):
        raise ConfigError(f"{field_name} must be a non-negative integer, got {value!r}")


def _encode(table: _Table, version: int) -> dict[str, Any]:
    offsets: dict[str, dict[str, int]] = {}
    for group, queues in table.items():
        for (topic, queue_id), offset in queues.items():
            offsets.setdefault(f"{topic}{_KEY_SEPARATOR}{group}", {})[str(queue_id)] = offset
    return {OFFSET_TABLE_KEY: offsets, "dataVersion": version}


def _load(file: AtomicJsonFile) -> tuple[_Table, int]:
    data = file.load()
    if data is None:
        return {}, 0
    return _decode(data, str(file.path))


def _decode(data: Mapping[str, Any], where: str) -> tuple[_Table, int]:
    version = read_data_version(data, where)
    offsets = data.get(OFFSET_TABLE_KEY, {})
    if not isinstance(offsets, dict):
        raise ConfigError(f"{where}: {OFFSET_TABLE_KEY} must be an object")
    table: _Table = {}
    for key, queues in offsets.items():
        topic, group = _split_key(key, where)
        group_table = table.setdefault(group, {})
        for queue_id, offset in _decode_queues(key, queues, where):
            group_table[topic, queue_id] = offset
    return table, version


def _split_key(key: str, where: str) -> tuple[str, str]:
    topic, separator, group = key.partition(_KEY_SEPARATOR)
    if not separator or not topic or not group or _KEY_SEPARATOR in group:
        raise ConfigError(f"{where}: {OFFSET_TABLE_KEY} key {key!r} is not <topic>@<group>")
    return topic, group


def _decode_queues(key: str, queues: object, where: str) -> list[tuple[int, int]]:
    if not isinstance(queues, dict):
        raise ConfigError(f"{where}: {OFFSET_TABLE_KEY}.{key} must be an object")
    decoded = []
    for queue_id, offset in queues.items():
        if not (queue_id.isascii() and queue_id.isdigit()) or not _is_count(offset):
            raise ConfigError(
                f"{where}: {OFFSET_TABLE_KEY}.{key}.{queue_id} must map a queue id to an offset"
            )
        decoded.append((int(queue_id), offset))
    return decoded
