"""A real small filesystem for full-disk tests: a tmpfs of a given size, mounted for the
test and unmounted after it, failure or not. Mounting needs root; elsewhere the test skips."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted_small_disk(directory: Path, size_bytes: int) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    directory.mkdir(parents=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", directory], check=True
    )
    try:
        yield directory
    finally:
        subprocess.run(["umount", "--lazy", directory], check=True)
