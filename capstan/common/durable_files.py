"""Durable file-system steps for every component that keeps files (store, pop, controller)."""

from __future__ import annotations

import json
import os
import pathlib
import threading
from typing import Any

_replacing: dict[pathlib.Path, threading.Lock] = {}
_replacing_guard = threading.Lock()


def _lock_for(target: pathlib.Path) -> threading.Lock:
    with _replacing_guard:
        return _replacing.setdefault(target, threading.Lock())


def sync_directory(directory: pathlib.Path) -> None:
    """fsync a directory, making a created, renamed or deleted entry in it durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(target: pathlib.Path, payload: bytes, private: bool = False) -> None:
    """Replace `target` with `payload` atomically: temp file, fsync, rename, fsync directory.
    A `private` file is readable by its owner alone (it holds secrets).

    Opening the temp file truncates any `.tmp` a crash left behind; the rename removes it.
    Two threads replacing the same file take turns: they would share the temp file, and
    the second rename would find it gone. Which payload lands last is the callers' order.
    """
    tmp = target.with_name(target.name + ".tmp")
    with _lock_for(target):
        with tmp.open("wb") as out:
            if private:
                os.fchmod(out.fileno(), 0o600)
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(target)  # os.replace underneath: atomic on POSIX even over an existing file
        sync_directory(target.parent)


def read_json_object(path: pathlib.Path, error: type[Exception]) -> dict[str, Any] | None:
    """The JSON object stored in `path`; None when there is no such file. A file that is not
    valid JSON, or holds something other than an object (torn, or not ours), raises `error`
    with a message naming it."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        loaded = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{path} is not valid JSON ({exc})") from exc
    if not isinstance(loaded, dict):
        raise error(f"{path} holds {type(loaded).__name__}, not an object")
    return loaded
