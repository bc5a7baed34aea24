"""Durable file-system steps for every component that keeps files (store, pop, controller)."""

from __future__ import annotations

import os
import pathlib


def sync_directory(directory: pathlib.Path) -> None:
    """fsync a directory, making a created, renamed or deleted entry in it durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(target: pathlib.Path, payload: bytes) -> None:
    """Replace `target` with `payload` atomically: temp file, fsync, rename, fsync directory.

    Opening the temp file truncates any `.tmp` a crash left behind; the rename removes it.
    """
    tmp = target.with_name(target.name + ".tmp")
    with tmp.open("wb") as out:
        out.write(payload)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(target)  # os.replace underneath: atomic on POSIX even over an existing file
    sync_directory(target.parent)
