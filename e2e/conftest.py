"""Fixtures of the e2e story: the cluster named by `$KUBECONFIG` (scripts/e2e.sh starts the
local node and sets it), the images to run, where the run's output goes, and the report that
every step adds its figures to (written as JSON and printed as a table at the end)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e.bounds import BOUNDS, breaches
from e2e.cluster import Kube

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Images:
    capstan: str
    capstan_next: str
    """A second tag of Capstan's image, for the rolling upgrade."""
    spark: str


@dataclass
class Report:
    path: Path
    started: float = field(default_factory=time.monotonic)
    steps: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def step(self, name: str, seconds: float, **figures: Any) -> None:
        """Record a step's figures, then fail it if one is past its bound (e2e/bounds.py)."""
        row = {"step": name, "seconds": round(seconds, 1), **figures}
        past = breaches(name, row)
        if past:
            row["past_bounds"] = past
        self.steps.append(row)
        self.write()
        if past:
            pytest.fail(f"{name}: past its bounds (e2e/bounds.py): " + "; ".join(past))

    def write(self) -> None:
        self.path.write_text(
            json.dumps(
                {
                    "seconds": round(time.monotonic() - self.started, 1),
                    "steps": self.steps,
                    **self.figures,
                },
                indent=1,
            )
        )

    def table(self) -> str:
        """The steps with their figures, each bounded one with its bound (e2e/bounds.py)."""
        rows = [("step", "seconds", "figures (bound)")]
        for s in self.steps:
            bounds = BOUNDS.get(s["step"], {})
            rest = ", ".join(
                f"{k}={v}" + (f" ({' '.join(map(str, bounds[k]))})" if k in bounds else "")
                for k, v in s.items()
                if k not in ("step", "seconds")
            )
            if "seconds" in bounds:
                rest = f"seconds ({' '.join(map(str, bounds['seconds']))}); " + rest
            rows.append((s["step"], str(s["seconds"]), rest))
        rows += [(k, "", json.dumps(v)) for k, v in self.figures.items()]
        width = [max(len(r[i]) for r in rows) for i in range(2)]
        return "\n".join(f"{r[0]:<{width[0]}}  {r[1]:>{width[1]}}  {r[2]}" for r in rows)


@pytest.fixture(scope="session")
def kube() -> Kube:
    path = os.environ.get("KUBECONFIG")
    if not path:
        pytest.fail("no cluster: run the story with `bash scripts/e2e.sh` (or set KUBECONFIG)")
    return Kube(Path(path))


@pytest.fixture(scope="session")
def images() -> Images:
    return Images(
        capstan=os.environ.get("E2E_IMAGE", "local/capstan:0.1.0"),
        capstan_next=os.environ.get("E2E_IMAGE_NEXT", "local/capstan:0.1.0-rev2"),
        spark=os.environ.get("E2E_SPARK_IMAGE", "local/capstan-spark:0.1.0"),
    )


@pytest.fixture(scope="session")
def output() -> Path:
    out = Path(os.environ.get("E2E_OUTPUT") or REPO / "e2e-output")
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="session")
def report(output: Path) -> Iterator[Report]:
    kept = Report(output / "report.json")
    try:
        yield kept
    finally:
        kept.write()
        print("\n== e2e report (" + str(kept.path) + ")\n" + kept.table(), flush=True)
