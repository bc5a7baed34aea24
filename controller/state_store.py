"""Where the controller keeps its state, and which controller replica leads.

The controller's decisions (masters, epochs, SyncStateSets) must outlive the controller
process and must never be made by two controllers at once. One interface, two backends:

- `FileStateStore`: files in a data directory, for a single controller (`capstan up`).
  Leadership is a lease file; writes are compare-and-swap on a version number under an
  advisory lock, so a second controller process pointed at the same directory by mistake
  gets conflicts, not a corrupted state.
- the Kubernetes backend (a coordination Lease for leadership, an object whose
  resourceVersion gives the compare-and-swap) for several controller replicas.

Both run the same contract test (tests/controller/test_state_store.py). The document is
opaque JSON here; what it holds is the controller's business.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import pathlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from capstan.common.durable_files import read_json_object, replace_durably
from capstan.common.errors import CapstanError
from capstan.kube.holding import Holding as Lease

STATE_FILE = "controller-state.json"
LEASE_FILE = "controller-lease.json"
LOCK_FILE = "controller.lock"


class StateConflict(CapstanError):
    """Someone else wrote the state since it was read: read again, decide again."""

    retriable = True


class StateBusy(CapstanError):
    """The state kept changing under us; try again."""

    retriable = True


class StateCorrupt(CapstanError):
    """The stored state cannot be read; the controller must not start from a guess."""

    retriable = False


@dataclass(frozen=True)
class Versioned:
    document: dict[str, Any]
    version: str
    """Opaque; "" when nothing was ever written."""


class StateStore(Protocol):
    def read(self) -> Versioned:
        """The current document and its version ({} and "" when never written)."""
        ...

    def write(self, document: dict[str, Any], expected_version: str) -> str:
        """Store `document` if the stored version is still `expected_version`; the new
        version. Raises StateConflict otherwise."""
        ...

    def try_lead(self, holder: str, duration_s: float) -> bool:
        """Take or renew the leadership for `duration_s`; whether `holder` leads now."""
        ...

    def leader(self) -> Lease | None:
        """The current lease, None when nobody holds an unexpired one."""
        ...

    def resign(self, holder: str) -> None:
        """Give up the leadership at once if `holder` has it (a clean shutdown)."""
        ...


CAS_ATTEMPTS = 16
"""Conflicting writes in a row before a change is given up (and reported UNAVAILABLE)."""

T = TypeVar("T")


def change_state(store: StateStore, decide: Callable[[dict[str, Any]], T]) -> T:
    """Apply `decide` (which edits the document it is given in place and returns its
    answer) with compare-and-swap; decided again from the fresh state on a conflict (another
    controller replica, or a concurrent change here). Nothing is written when `decide`
    changed nothing."""
    for _ in range(CAS_ATTEMPTS):
        current = store.read()
        document = copy.deepcopy(current.document)
        answer = decide(document)
        if document == current.document:
            return answer
        try:
            store.write(document, current.version)
        except StateConflict:
            continue
        return answer
    raise StateBusy(f"the controller state changed {CAS_ATTEMPTS} times during one update")


class FileStateStore:
    """The state in `directory`/controller-state.json, the lease beside it."""

    def __init__(self, directory: pathlib.Path, clock: Callable[[], float] = time.time) -> None:
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialize read-modify-write across processes sharing the directory."""
        fd = os.open(self._dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the flock

    def _load(self, name: str) -> dict[str, Any] | None:
        return read_json_object(self._dir / name, StateCorrupt)

    def _read_locked(self) -> Versioned:
        stored = self._load(STATE_FILE)
        if stored is None:
            return Versioned({}, "")
        version, document = stored.get("version"), stored.get("document")
        if not isinstance(version, int) or not isinstance(document, dict):
            raise StateCorrupt(f"{self._dir / STATE_FILE} lacks an integer version and a document")
        return Versioned(document, str(version))

    def read(self) -> Versioned:
        with self._locked():
            return self._read_locked()

    def write(self, document: dict[str, Any], expected_version: str) -> str:
        with self._locked():
            current = self._read_locked().version
            if current != expected_version:
                raise StateConflict(
                    f"the controller state is at version {current or 'none'}, "
                    f"not {expected_version or 'none'}"
                )
            version = int(current or 0) + 1
            payload = json.dumps({"version": version, "document": document}, sort_keys=True)
            replace_durably(self._dir / STATE_FILE, payload.encode())
            return str(version)

    def _lease_locked(self) -> Lease | None:
        stored = self._load(LEASE_FILE)
        if stored is None or not stored.get("holder"):
            return None
        try:
            return Lease(
                str(stored["holder"]), float(stored["renewed_at_s"]), float(stored["duration_s"])
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StateCorrupt(f"{self._dir / LEASE_FILE} is malformed ({exc})") from exc

    def _store_lease_locked(self, lease: Lease | None) -> None:
        payload = {} if lease is None else lease.__dict__
        replace_durably(self._dir / LEASE_FILE, json.dumps(payload).encode())

    def try_lead(self, holder: str, duration_s: float) -> bool:
        if not holder or duration_s <= 0:
            raise ValueError("a lease needs a holder and a positive duration")
        with self._locked():
            now = self._clock()
            lease = self._lease_locked()
            if lease is not None and lease.holder != holder and not lease.expired(now):
                return False
            self._store_lease_locked(Lease(holder, now, duration_s))
            return True

    def leader(self) -> Lease | None:
        with self._locked():
            lease = self._lease_locked()
        if lease is None or lease.expired(self._clock()):
            return None
        return lease

    def resign(self, holder: str) -> None:
        with self._locked():
            lease = self._lease_locked()
            if lease is not None and lease.holder == holder:
                self._store_lease_locked(None)
