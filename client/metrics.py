"""The SDK's Prometheus metrics, in a registry of its own per client.

Names follow RocketMQ 5's client metrics where one exists (rocketmq_process_time,
rocketmq_consume_failures) and use a capstan_ prefix for the rest. Latencies are in seconds.
Expose them with `prometheus_client.start_http_server(port, registry=consumer.metrics.registry)`
or by adding the registry to an application's own exposition.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

LATENCY_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)


class ConsumerMetrics:
    def __init__(self, group: str, client_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._labels = {"consumer_group": group, "client_id": client_id}
        names = list(self._labels)
        reg = self.registry
        self.pull_latency = Histogram(
            "capstan_pull_latency_seconds",
            "Time from sending a pull to its answer (long polls included)",
            names,
            buckets=LATENCY_BUCKETS_S,
            registry=reg,
        ).labels(**self._labels)
        self.pulled_messages = Counter(
            "capstan_pulled_messages", "Messages pulled", names, registry=reg
        ).labels(**self._labels)
        self.flow_control = Counter(
            "capstan_flow_control",
            "Pulls put off because the queue's cache was full",
            [*names, "reason"],
            registry=reg,
        )
        self.consume_latency = Histogram(
            "rocketmq_process_time",
            "Time the listener took for a batch, in seconds",
            names,
            buckets=LATENCY_BUCKETS_S,
            registry=reg,
        ).labels(**self._labels)
        self.consumed = Counter(
            "capstan_consumed_messages", "Messages the listener consumed", names, registry=reg
        ).labels(**self._labels)
        self.consume_failures = Counter(
            "rocketmq_consume_failures",
            "Messages the listener failed (RECONSUME_LATER, an exception, or past ackIndex)",
            names,
            registry=reg,
        ).labels(**self._labels)
        self.send_backs = Counter(
            "capstan_send_back",
            "Failed messages sent back to the broker",
            [*names, "result"],
            registry=reg,
        )
        self.rebalances = Counter(
            "capstan_rebalances", "Rebalances run", [*names, "trigger"], registry=reg
        )
        self.owned_queues = Counter(
            "capstan_queues_taken", "Queues this client started consuming", names, registry=reg
        ).labels(**self._labels)

    def flow_control_hit(self, reason: str) -> None:
        self.flow_control.labels(**self._labels, reason=reason).inc()

    def send_back(self, result: str) -> None:
        self.send_backs.labels(**self._labels, result=result).inc()

    def rebalanced(self, trigger: str) -> None:
        self.rebalances.labels(**self._labels, trigger=trigger).inc()
