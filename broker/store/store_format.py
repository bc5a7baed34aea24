"""The broker store's format number and its migrations (the rule: capstan/common/data_format.py).

Raise STORE_FORMAT whenever a file of the store changes in a way an older broker could
misread, and add the step from the old number to STORE_MIGRATIONS. The store directory's
`FORMAT` file records the number; a broker refuses a store of a higher one.
"""

from __future__ import annotations

import pathlib

from capstan.common.data_format import DirectoryMigration, settle_directory

KIND = "broker store"
STORE_FORMAT = 1
"""1: the CommitLog, ConsumeQueue, index, checkpoint and config files as written since 0.1.0."""
STORE_MIGRATIONS: dict[int, DirectoryMigration] = {}


def settle_store(root: pathlib.Path) -> int:
    """Check (and mark, or migrate) the store at `root` before anything in it is opened."""
    return settle_directory(root, KIND, STORE_FORMAT, STORE_MIGRATIONS)
