"""The replication state of one broker group, as the controller persists it.

Every decision of the controller (electing a master, changing the SyncStateSet) maps one
`ReplicaInfo` onto the next. The two epochs in it are the fencing tokens: a broker acting on
an older master epoch was deposed, and a SyncStateSet proposal built on an older
SyncStateSet epoch was built on a set that has since changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

_KEYS = (
    "group",
    "master_id",
    "master_epoch",
    "sync_state_set",
    "sync_state_set_epoch",
    "replicas",
)


def format_ids(ids: Iterable[int]) -> str:
    """Render broker ids as `{1,2,3}`, sorted, so reasons and logs read the same every run."""
    return "{" + ",".join(str(i) for i in sorted(ids)) + "}"


@dataclass(frozen=True)
class ReplicaInfo:
    """One broker group's replication state; the defaults describe a fresh group.

    `master_epoch` rises on every change of master, including a change to no master, so the
    old master is fenced even when nobody could replace it. `sync_state_set_epoch` rises on
    every change of the SyncStateSet, so concurrent proposals cannot overwrite each other.
    `replicas` only grows: a broker id once registered keeps its data and may come back.
    """

    group: str
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set: frozenset[int] = frozenset()
    sync_state_set_epoch: int = 0
    replicas: frozenset[int] = frozenset()

    def violations(self) -> list[str]:
        """Every broken invariant, in words; empty when the state is one we may act on."""
        epochs = {
            "master_epoch": self.master_epoch,
            "sync_state_set_epoch": self.sync_state_set_epoch,
        }
        found = [f"{name} {value} is negative" for name, value in epochs.items() if value < 0]
        bad_ids = {i for i in self._all_ids() if i <= 0}
        if bad_ids:
            found.append(f"broker ids must be positive, not {format_ids(bad_ids)}")
        if self.master_id is not None and self.master_id not in self.sync_state_set:
            found.append(f"master {self.master_id} is not in the SyncStateSet")
        strangers = self.sync_state_set - self.replicas
        if strangers:
            found.append(f"SyncStateSet members {format_ids(strangers)} are not registered")
        return found

    def _all_ids(self) -> frozenset[int]:
        master = frozenset() if self.master_id is None else frozenset({self.master_id})
        return self.replicas | self.sync_state_set | master

    def validate(self) -> None:
        """Raise ValueError naming every broken invariant, so bad state is never acted on."""
        found = self.violations()
        if found:
            raise ValueError(f"replica info of {self.group!r}: " + "; ".join(found))

    def to_json(self) -> dict[str, object]:
        """A JSON-ready document; ids sorted so the same state always serialises the same."""
        return {
            "group": self.group,
            "master_id": self.master_id,
            "master_epoch": self.master_epoch,
            "sync_state_set": sorted(self.sync_state_set),
            "sync_state_set_epoch": self.sync_state_set_epoch,
            "replicas": sorted(self.replicas),
        }

    @classmethod
    def from_json(cls, doc: object) -> ReplicaInfo:
        """Read back `to_json()`'s document (as `json.load` returns it).

        A persisted document is trusted with the group's fencing epochs, so anything unexpected
        (a missing or unknown key, a wrong type, a duplicate id, a broken invariant) raises
        ValueError instead of being repaired silently.
        """
        fields = _checked_keys(doc)
        info = cls(
            group=_group_field(fields),
            master_id=_optional_int_field(fields, "master_id"),
            master_epoch=_int_field(fields, "master_epoch"),
            sync_state_set=_ids_field(fields, "sync_state_set"),
            sync_state_set_epoch=_int_field(fields, "sync_state_set_epoch"),
            replicas=_ids_field(fields, "replicas"),
        )
        info.validate()
        return info


def _checked_keys(doc: object) -> dict[str, object]:
    if not isinstance(doc, dict):
        raise ValueError(f"replica info document must be a JSON object, not {type(doc).__name__}")
    unknown = sorted(str(k) for k in doc if k not in _KEYS)
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} in replica info document")
    missing = [k for k in _KEYS if k not in doc]
    if missing:
        raise ValueError(f"replica info document lacks {missing[0]!r}")
    return {str(k): v for k, v in doc.items()}


def _group_field(fields: dict[str, object]) -> str:
    group = fields["group"]
    if not isinstance(group, str) or not group:
        raise ValueError(f"replica info field 'group' must be a non-empty string, not {group!r}")
    return group


def _as_int(value: object, what: str) -> int:
    # bool is a subclass of int; `true` where an id belongs is a corrupt document.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, not {value!r}")
    return value


def _int_field(fields: dict[str, object], key: str) -> int:
    return _as_int(fields[key], f"replica info field {key!r}")


def _optional_int_field(fields: dict[str, object], key: str) -> int | None:
    return None if fields[key] is None else _int_field(fields, key)


def _ids_field(fields: dict[str, object], key: str) -> frozenset[int]:
    value = fields[key]
    if not isinstance(value, list):
        raise ValueError(f"replica info field {key!r} must be a list of broker ids, not {value!r}")
    ids = [_as_int(item, f"an id in replica info field {key!r}") for item in value]
    if len(set(ids)) != len(ids):
        raise ValueError(f"replica info field {key!r} repeats a broker id: {value!r}")
    return frozenset(ids)
