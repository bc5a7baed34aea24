"""Who holds a leadership lease and until when: the record both the Kubernetes Lease
(lease.py) and the controller's file-backed store keep (no Kubernetes import here, so a
local controller does not load the client)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Holding:
    holder: str
    renewed_at_s: float
    """Wall-clock time (seconds since the epoch) of the last acquire or renewal."""
    duration_s: float

    def expired(self, now_s: float) -> bool:
        return now_s > self.renewed_at_s + self.duration_s
