"""`capstan spark audit` against a running cluster, as the last check of a fault test: the
audit must find nothing wrong (exit status 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.tiers import process_tool


@process_tool
def audit_finds_nothing(controller: str) -> dict[str, Any]:
    """Run the audit on the cluster behind `controller`; its JSON report, once it has
    found no problem (AssertionError with the report otherwise)."""
    done = subprocess.run(
        [sys.executable, "-m", "capstan.cli", "spark", "audit", "--controller", controller,
         "--master", "local[2]", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )  # fmt: skip
    assert done.returncode == 0, f"the audit found problems:\n{done.stdout}\n{done.stderr[-3000:]}"
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["ok"] and report["records_checked"] > 0, report
    return report
