"""The controller's state document under the stored-format rule (capstan/common/data_format.py).

`FormattedStateStore` wraps either backend: every read gives the document as the current
format (an older one migrated in memory, a newer one refused), every write stamps it, and
`commit_format` (the leader, once it leads) writes a migrated document back, which is the
migration's commit: until then the stored document stays as the older Capstan wrote it.
"""

from __future__ import annotations

from typing import Any

from capstan import __version__
from capstan.common.data_format import (
    FORMAT_KEY,
    WRITTEN_BY_KEY,
    DocumentMigration,
    settle_document,
)
from capstan.controller.state_store import StateConflict, StateStore, Versioned
from capstan.kube.holding import Holding as Lease

STATE_FORMAT = 1
"""The state document's format (1: as written before formats were numbered)."""
STATE_MIGRATIONS: dict[int, DocumentMigration] = {}
"""Per format N < STATE_FORMAT, the step from N to N+1."""
KIND = "controller state"


class FormattedStateStore:
    def __init__(
        self,
        inner: StateStore,
        where: str,
        current: int = STATE_FORMAT,
        migrations: dict[int, DocumentMigration] | None = None,
    ) -> None:
        self.inner = inner
        self._where = where
        self._current = current
        self._migrations = STATE_MIGRATIONS if migrations is None else migrations

    def _settled(self, stored: Versioned) -> Versioned:
        document = settle_document(
            stored.document, KIND, self._current, self._migrations, self._where
        )
        return Versioned(document, stored.version)

    def read(self) -> Versioned:
        return self._settled(self.inner.read())

    def write(self, document: dict[str, Any], expected_version: str) -> str:
        stamped = {**document, FORMAT_KEY: self._current, WRITTEN_BY_KEY: __version__}
        return self.inner.write(stamped, expected_version)

    def commit_format(self) -> bool:
        """Write the document back if it is stored in an older format; whether it was.
        A concurrent write (which stamps the current format itself) makes it unneeded."""
        stored = self.inner.read()
        if not stored.document or stored.document.get(FORMAT_KEY) == self._current:
            return False
        settled = self._settled(stored)
        try:
            self.inner.write(settled.document, stored.version)
        except StateConflict:
            return False
        return True

    def try_lead(self, holder: str, duration_s: float) -> bool:
        return self.inner.try_lead(holder, duration_s)

    def leader(self) -> Lease | None:
        return self.inner.leader()

    def resign(self, holder: str) -> None:
        self.inner.resign(holder)
