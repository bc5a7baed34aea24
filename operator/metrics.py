"""The operator's own Prometheus metrics: how long each reconcile takes and how it ends,
per resource kind, served on `--metrics-port` beside Kopf's liveness endpoint."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconcile_seconds = Histogram(
            "capstan_operator_reconcile_seconds",
            "Time one reconcile of a resource took, by kind and outcome",
            ["kind", "outcome"],
            buckets=_BUCKETS_S,
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "capstan_operator_reconcile_errors",
            "Reconciles that ended in an error (temporary ones are retried with back-off)",
            ["kind", "error"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "capstan_operator_leader",
            "1 on the replica that acts (holds the operator's Lease, or runs alone), else 0",
            registry=self.registry,
        )

    @contextmanager
    def reconcile(self, kind: str) -> Iterator[None]:
        """Time the block as one reconcile of `kind`; an exception counts as an error
        (by its class name) and goes on to Kopf, which retries it."""
        started = time.perf_counter()
        try:
            yield
        except BaseException as exc:
            self.reconcile_seconds.labels(kind, "error").observe(time.perf_counter() - started)
            self.reconcile_errors.labels(kind, type(exc).__name__).inc()
            raise
        self.reconcile_seconds.labels(kind, "ok").observe(time.perf_counter() - started)
