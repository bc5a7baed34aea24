"""Every reconcile is timed by kind and outcome; errors are counted by class."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from capstan.operator.metrics import OperatorMetrics


def test_reconciles_are_timed_and_errors_counted() -> None:
    metrics = OperatorMetrics()
    with metrics.reconcile("Topic"):
        pass
    with pytest.raises(TimeoutError), metrics.reconcile("Topic"):
        raise TimeoutError("broker group did not answer")
    text = generate_latest(metrics.registry).decode()
    assert 'capstan_operator_reconcile_seconds_count{kind="Topic",outcome="ok"} 1.0' in text
    assert 'capstan_operator_reconcile_seconds_count{kind="Topic",outcome="error"} 1.0' in text
    assert 'capstan_operator_reconcile_errors_total{error="TimeoutError",kind="Topic"} 1.0' in text
