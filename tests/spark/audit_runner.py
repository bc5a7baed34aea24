"""The offset audit (spark/audit.py) against a running cluster, as the last check of a fault
test: it must find nothing wrong. It runs in the test's own Spark session, started once per
module; `capstan spark audit` itself is tested in tests/spark/test_offset_audit.py."""

from __future__ import annotations

from typing import Any

from capstan.spark.audit import audit, summary


def audit_finds_nothing(controller: str, spark: Any) -> dict[str, Any]:
    """Audit the cluster behind `controller`; its report as JSON, once it has found no
    problem (AssertionError with the report otherwise)."""
    report = audit(spark, controller)
    assert report.ok, f"the audit found problems:\n{summary(report)}\n{report.to_json()}"
    assert report.records_checked > 0, report.to_json()
    found: dict[str, Any] = report.to_json()
    return found
