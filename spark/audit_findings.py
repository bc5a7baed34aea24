"""What an offset audit (audit.py) finds, as the report (audit_report.py) shows it: the
problems, the lags and backlogs, and the report that holds them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PROBLEM_KINDS = (
    "committed_past_max",
    "committed_below_min",
    "unreadable",
    "crc_mismatch",
    "replica_divergence",
    "replica_missing",
    "gap",
)


@dataclass
class Problem:
    kind: str
    broker_group: str
    topic: str
    queue_id: int
    detail: str
    replica: str = ""
    count: int = 1
    offsets: list[int] = field(default_factory=list)
    """The first MAX_OFFSETS_LISTED queue offsets concerned."""


@dataclass
class QueueLag:
    consumer_group: str
    broker_group: str
    topic: str
    queue_id: int
    committed: int
    min_offset: int
    max_offset: int
    lag: int
    lag_age_s: float | None
    inflight: int


@dataclass
class GroupBacklog:
    consumer_group: str
    retry_messages: int = 0
    dlq_messages: int = 0


@dataclass
class AuditReport:
    started_ms: int
    finished_ms: int = 0
    broker_groups: list[str] = field(default_factory=list)
    replicas_read: int = 0
    topics_read: list[str] = field(default_factory=list)
    records_checked: int = 0
    lags: list[QueueLag] = field(default_factory=list)
    backlogs: list[GroupBacklog] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(PROBLEM_KINDS, 0)
        for p in self.problems:
            counts[p.kind] += p.count
        return counts

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "problem_counts": self.problem_counts()}
