"""Small JSON files that a crash can never leave with only a torn copy, and tables kept in them.

The broker's config files (topics, subscription groups, consumer offsets) are rewritten whole
on every change. Writing in place would leave a half-written file after a crash or power cut,
so `AtomicJsonFile` writes a temporary file, fsyncs it, renames it over the target and fsyncs
the directory so the rename itself is durable. A `.bak` copy is then written the same way,
after the main file: it always holds a complete version equal to, or one save older than, the
main file. That second copy covers what a rename cannot: a file damaged later on disk, or a
filesystem that reordered the rename before the data.

`JsonConfigTable` is the shape the topic and subscription-group stores share: named, frozen
config records in one file with a `dataVersion` counter, as RocketMQ's `ConfigManager` keeps.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from capstan.common.durable_files import replace_durably
from capstan.common.errors import ConfigError, StoreCorruptError

log = logging.getLogger(__name__)

T = TypeVar("T")

DATA_VERSION_KEY = "dataVersion"


class _UnreadableError(Exception):
    """A file exists but does not hold a JSON object; the message says why."""


class AtomicJsonFile:
    """One JSON object on disk, replaced atomically on save, with a `.bak` copy to fall back on.

    Not safe for concurrent `save` calls from several threads (they share the temporary file
    names); the stores serialise their saves with their own lock.
    """

    def __init__(self, path: Path, private: bool = False) -> None:
        self._path = path
        self._backup = path.with_name(path.name + ".bak")
        self._private = private
        """Whether the file (and its backup) is readable by its owner alone."""

    @property
    def path(self) -> Path:
        return self._path

    @property
    def backup_path(self) -> Path:
        return self._backup

    def load(self) -> dict[str, Any] | None:
        """The last saved object; None when neither the file nor its backup exists.

        Raises StoreCorruptError when the file is damaged and the backup cannot help either.
        """
        try:
            data = _read_object(self._path)
        except _UnreadableError as exc:
            log.warning("%s is damaged (%s); falling back to %s", self._path, exc, self._backup)
            return self._load_backup(main_problem=str(exc))
        if data is not None:
            return data
        return self._load_backup(main_problem=None)

    def save(self, data: Mapping[str, Any]) -> None:
        """Replace the file with `data`, then bring the backup up to the same content."""
        # Encode first: a value JSON cannot hold must fail before any file is touched.
        payload = (json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()
        self._path.parent.mkdir(parents=True, exist_ok=True)
        replace_durably(self._path, payload, self._private)
        replace_durably(self._backup, payload, self._private)

    def _load_backup(self, main_problem: str | None) -> dict[str, Any] | None:
        main_state = main_problem if main_problem is not None else "missing"
        try:
            data = _read_object(self._backup)
        except _UnreadableError as exc:
            raise StoreCorruptError(
                f"{self._path} is {main_state} and its backup {self._backup} is damaged ({exc})"
            ) from None
        if data is None and main_problem is not None:
            raise StoreCorruptError(f"{self._path} is {main_problem} and has no backup")
        if data is not None and main_problem is None:
            log.warning("%s is missing; using its backup %s", self._path, self._backup)
        return data


def _read_object(path: Path) -> dict[str, Any] | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _UnreadableError(f"unreadable: {exc}") from exc
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both derive from it
        raise _UnreadableError(f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise _UnreadableError(f"holds a JSON {type(data).__name__}, not an object")
    return data


class JsonConfigTable(Generic[T]):
    """Named records of type T in one `AtomicJsonFile`, with a change counter; thread-safe.

    File layout: `{"<table_key>": {"<name>": <record as dict>}, "dataVersion": <int>}`.
    `dataVersion` grows by one on each change, so replicas can tell which copy is newer. Each
    change is saved before it becomes visible: if the save fails, memory still matches disk.
    """

    def __init__(
        self,
        path: Path,
        table_key: str,
        encode: Callable[[T], dict[str, Any]],
        decode: Callable[[Mapping[str, Any]], T],
        name_of: Callable[[T], str],
        private: bool = False,
    ) -> None:
        self._file = AtomicJsonFile(path, private)
        self._table_key = table_key
        self._encode = encode
        self._decode = decode
        self._name_of = name_of
        self._lock = threading.Lock()
        self._records, self._version = self._load()

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def data_version(self) -> int:
        with self._lock:
            return self._version

    def get(self, name: str) -> T | None:
        with self._lock:
            return self._records.get(name)

    def put(self, record: T) -> None:
        """Create or replace the record of that name and save at once; no-op if unchanged."""
        name = self._name_of(record)
        with self._lock:
            if self._records.get(name) == record:
                return
            self._commit_locked({**self._records, name: record})

    def delete(self, name: str) -> bool:
        """Remove the record and save at once; False if there was none."""
        with self._lock:
            if name not in self._records:
                return False
            remaining = dict(self._records)
            del remaining[name]
            self._commit_locked(remaining)
            return True

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._records)

    def all(self) -> list[T]:
        """Every record, ordered by name."""
        with self._lock:
            return [self._records[name] for name in sorted(self._records)]

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._records

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def export(self) -> dict[str, Any]:
        """The whole table as its file holds it (what a master sends its slaves)."""
        with self._lock:
            table = {name: self._encode(record) for name, record in self._records.items()}
            return {self._table_key: table, DATA_VERSION_KEY: self._version}

    def replace_all(self, document: Mapping[str, Any], where: str) -> None:
        """Take over a master's `export()`: every record is replaced, and saved, at once.
        ConfigError (nothing changes) when the document is malformed."""
        version = read_data_version(document, where)
        table = document.get(self._table_key, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: {self._table_key} must be an object")
        records = {name: self._decode_entry(name, raw, where) for name, raw in table.items()}
        with self._lock:
            self._file.save({self._table_key: table, DATA_VERSION_KEY: version})
            self._records, self._version = records, version

    def _commit_locked(self, records: dict[str, T]) -> None:
        version = self._version + 1
        table = {name: self._encode(record) for name, record in records.items()}
        self._file.save({self._table_key: table, DATA_VERSION_KEY: version})
        self._records, self._version = records, version

    def _load(self) -> tuple[dict[str, T], int]:
        data = self._file.load()
        if data is None:
            return {}, 0
        where = str(self._file.path)
        version = read_data_version(data, where)
        table = data.get(self._table_key, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: {self._table_key} must be an object")
        return {name: self._decode_entry(name, raw, where) for name, raw in table.items()}, version

    def _decode_entry(self, name: str, raw: object, where: str) -> T:
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: {self._table_key}.{name} must be an object")
        try:
            record = self._decode(raw)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {self._table_key}.{name}: {exc}") from exc
        if self._name_of(record) != name:
            raise ConfigError(
                f"{where}: {self._table_key}.{name} holds a record named {self._name_of(record)!r}"
            )
        return record


def read_data_version(data: Mapping[str, Any], where: str) -> int:
    """The `dataVersion` of a loaded file (0 when absent); ConfigError if it is not a count."""
    version = data.get(DATA_VERSION_KEY, 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ConfigError(f"{where}: {DATA_VERSION_KEY} must be a non-negative integer")
    return version
