"""Write Capstan's Grafana dashboards (charts/capstan/files/dashboards/*.json) from the panel
lists below: the chart ships them as ConfigMaps for Grafana's sidecar.

`python scripts/gen_dashboards.py` writes them; `--check` fails when the committed files
differ from what this script makes (lint.sh runs it), so a dashboard is changed here.

Every panel queries the data source chosen in the dashboard's `datasource` variable; broker
panels filter on `cluster` (the broker group) and controller panels on `group`, both
multi-value variables with All. `$__rate_interval` is Grafana's own.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "charts" / "capstan" / "files" / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
C = 'cluster=~"$cluster"'
G = 'group=~"$group"'
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Panel:
    title: str
    queries: list[tuple[str, str]]
    """(PromQL, legend) pairs."""
    unit: str = "short"
    kind: str = "timeseries"
    description: str = ""
    width: int = 12


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: list[tuple[str, list[Panel]]]
    variables: list[str] = field(default_factory=lambda: ["cluster"])


def quantile(q: float, calls: str, by: str = "") -> str:
    """The q-quantile of the RPC latency of `calls` (a label matcher), per `by` labels."""
    labels = ", ".join(["le", by] if by else ["le"])
    return (
        f"histogram_quantile({q}, sum by ({labels}) "
        f"(rate(rocketmq_rpc_latency_bucket{{{calls}}}[{RATE}])))"
    )


DASHBOARDS = [
    Dashboard(
        "capstan-overview",
        "Capstan / Overview",
        "The whole system at a glance: groups, masters, traffic, backlog and trouble.",
        [
            (
                "Health",
                [
                    Panel(
                        "Groups without a master",
                        [
                            (
                                f"sum(1 - max by (group) (capstan_controller_group_has_master{{{G}}}))",
                                "groups",
                            )
                        ],
                        kind="stat",
                        width=6,
                        description="Broker groups the controller has no master for (0 is healthy).",
                    ),
                    Panel(
                        "Brokers down",
                        [
                            (
                                f"count(capstan_controller_replica_alive{{{G}}} == 0) or vector(0)",
                                "brokers",
                            )
                        ],
                        kind="stat",
                        width=6,
                        description="Replicas whose heartbeats stopped, as the controller sees them.",
                    ),
                    Panel(
                        "Messages in per second",
                        [(f"sum(rate(rocketmq_messages_in_total[{RATE}]))", "in")],
                        unit="ops",
                        kind="stat",
                        width=6,
                    ),
                    Panel(
                        "Consumer backlog",
                        [
                            (
                                f"sum(max by (cluster, consumer_group, topic) (rocketmq_consumer_lag_messages{{{C}}}))",
                                "messages",
                            )
                        ],
                        kind="stat",
                        width=6,
                    ),
                ],
            ),
            (
                "Traffic",
                [
                    Panel(
                        "Messages in and out",
                        [
                            (f"sum(rate(rocketmq_messages_in_total[{RATE}]))", "in"),
                            (f"sum(rate(rocketmq_messages_out_total[{RATE}]))", "out"),
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Send and receive latency, p99",
                        [
                            (
                                quantile(
                                    0.99,
                                    'request_code=~"SendMessage|ReceiveMessage"',
                                    "request_code",
                                ),
                                "{{request_code}}",
                            )
                        ],
                        unit="s",
                    ),
                ],
            ),
            (
                "Replication and storage",
                [
                    Panel(
                        "SyncStateSet size per group",
                        [
                            (
                                f"max by (group) (capstan_controller_sync_state_set_size{{{G}}})",
                                "{{group}}",
                            )
                        ],
                    ),
                    Panel(
                        "Writes not confirmed, per second",
                        [
                            (
                                f"sum by (status) (rate(capstan_put_failures_total[{RATE}]))",
                                "{{status}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Fullest store disk",
                        [
                            (
                                f"max by (cluster) (capstan_store_disk_used_ratio{{{C}}})",
                                "{{cluster}}",
                            ),
                            (f"min(capstan_store_disk_max_used_ratio{{{C}}})", "limit"),
                        ],
                        unit="percentunit",
                    ),
                    Panel(
                        "Dead letters per second",
                        [
                            (
                                f"sum by (consumer_group) (rate(rocketmq_send_to_dlq_messages_total[{RATE}]))",
                                "{{consumer_group}}",
                            )
                        ],
                        unit="ops",
                    ),
                ],
            ),
        ],
        ["cluster", "group"],
    ),
    Dashboard(
        "capstan-broker",
        "Capstan / Broker",
        "One broker group's replicas: throughput, latency, the store and its flushes.",
        [
            (
                "Throughput",
                [
                    Panel(
                        "Messages in by topic",
                        [
                            (
                                f"sum by (topic) (rate(rocketmq_messages_in_total[{RATE}]))",
                                "{{topic}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Messages out by topic",
                        [
                            (
                                f"sum by (topic) (rate(rocketmq_messages_out_total[{RATE}]))",
                                "{{topic}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Body bytes in and out",
                        [
                            (f"sum(rate(rocketmq_throughput_in_total[{RATE}]))", "in"),
                            (f"sum(rate(rocketmq_throughput_out_total[{RATE}]))", "out"),
                        ],
                        unit="Bps",
                    ),
                    Panel(
                        "Clients",
                        [
                            (
                                f"sum by (node_id) (rocketmq_producer_connections{{{C}}})",
                                "producers {{node_id}}",
                            ),
                            (
                                f"sum by (node_id) (rocketmq_consumer_connections{{{C}}})",
                                "consumers {{node_id}}",
                            ),
                        ],
                    ),
                ],
            ),
            (
                "Latency",
                [
                    Panel(
                        "Send latency p50, p99",
                        [
                            (quantile(0.5, 'request_code="SendMessage"'), "p50"),
                            (quantile(0.99, 'request_code="SendMessage"'), "p99"),
                        ],
                        unit="s",
                    ),
                    Panel(
                        "Calls per second by method and code",
                        [
                            (
                                f"sum by (request_code, response_code) (rate(rocketmq_rpc_latency_count[{RATE}]))",
                                "{{request_code}} {{response_code}}",
                            )
                        ],
                        unit="ops",
                    ),
                ],
            ),
            (
                "Store",
                [
                    Panel(
                        "CommitLog on disk",
                        [(f"rocketmq_storage_size{{{C}}}", "{{node_id}}")],
                        unit="bytes",
                    ),
                    Panel(
                        "Disk used, and the retention limit",
                        [
                            (f"capstan_store_disk_used_ratio{{{C}}}", "{{node_id}}"),
                            (f"max(capstan_store_disk_max_used_ratio{{{C}}})", "limit"),
                        ],
                        unit="percentunit",
                    ),
                    Panel(
                        "Not yet in consume queues",
                        [(f"capstan_dispatch_behind_bytes{{{C}}}", "{{node_id}}")],
                        unit="bytes",
                    ),
                    Panel(
                        "Writes not confirmed (flush and replication timeouts)",
                        [
                            (
                                f"sum by (status) (rate(capstan_put_failures_total[{RATE}]))",
                                "{{status}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Long polls waiting",
                        [(f"capstan_long_polls_suspended{{{C}}}", "{{node_id}}")],
                    ),
                    Panel(
                        "Delayed and half messages",
                        [
                            (f"sum(rocketmq_timer_enqueue_messages{{{C}}})", "delayed"),
                            (
                                f"sum(capstan_transaction_half_messages{{{C}}})",
                                "half (transactions)",
                            ),
                        ],
                    ),
                ],
            ),
        ],
    ),
    Dashboard(
        "capstan-ha",
        "Capstan / HA",
        "Masters, epochs, SyncStateSets, replica gaps and elections.",
        [
            (
                "Masters",
                [
                    Panel(
                        "Master of each group",
                        [(f"capstan_replica_is_master{{{C}}} == 1", "{{cluster}}: {{node_id}}")],
                        description="Which replica serves as master (a change is a failover or a switch).",
                    ),
                    Panel(
                        "Master epoch",
                        [(f"max by (group) (capstan_controller_master_epoch{{{G}}})", "{{group}}")],
                        description="Grows at each election; a step is a master change.",
                    ),
                    Panel(
                        "Elections in the last 15 minutes",
                        [
                            (
                                f"max by (group) (increase(capstan_controller_elections_total{{{G}}}[15m]))",
                                "{{group}}",
                            )
                        ],
                    ),
                    Panel(
                        "Replicas alive (heartbeats)",
                        [
                            (
                                f"capstan_controller_replica_alive{{{G}}}",
                                "{{group}} broker {{broker_id}}",
                            )
                        ],
                    ),
                ],
            ),
            (
                "In-sync replicas",
                [
                    Panel(
                        "SyncStateSet size and minimum",
                        [
                            (
                                f"max by (cluster) (capstan_replica_sync_state_set_size{{{C}}} and capstan_replica_is_master == 1)",
                                "{{cluster}} in sync",
                            ),
                            (
                                f"max by (cluster) (capstan_replica_min_in_sync_replicas{{{C}}})",
                                "{{cluster}} minimum",
                            ),
                        ],
                    ),
                    Panel(
                        "Replica gap",
                        [
                            (
                                f"capstan_replica_slave_lag_bytes{{{C}}}",
                                "{{cluster}} slave {{slave_id}}",
                            )
                        ],
                        unit="bytes",
                    ),
                    Panel(
                        "Writes waiting for their copies",
                        [(f"capstan_replica_acks_waiting{{{C}}}", "{{node_id}}")],
                    ),
                    Panel(
                        "Slave acting as master",
                        [(f"capstan_replica_acting_master{{{C}}}", "{{node_id}}")],
                    ),
                    Panel(
                        "Damaged records not mended yet",
                        [(f"capstan_replica_damaged_records{{{C}}}", "{{node_id}}")],
                    ),
                ],
            ),
        ],
        ["cluster", "group"],
    ),
    Dashboard(
        "capstan-consumer-groups",
        "Capstan / Consumer groups",
        "Each group's backlog, messages in flight, retries, dead letters and rebalances.",
        [
            (
                "Backlog",
                [
                    Panel(
                        "Lag by group and topic",
                        [
                            (
                                f"max by (consumer_group, topic) (rocketmq_consumer_lag_messages{{{C}}})",
                                "{{consumer_group}} / {{topic}}",
                            )
                        ],
                    ),
                    Panel(
                        "In flight (received, not yet acknowledged)",
                        [
                            (
                                f"max by (consumer_group, topic) (rocketmq_consumer_inflight_messages{{{C}}})",
                                "{{consumer_group}} / {{topic}}",
                            )
                        ],
                    ),
                ],
            ),
            (
                "Failures",
                [
                    Panel(
                        "Redeliveries per second",
                        [
                            (
                                f"sum by (consumer_group) (rate(capstan_pop_redeliveries_total[{RATE}]))",
                                "{{consumer_group}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Sent back for retry per second",
                        [
                            (
                                f"sum by (consumer_group) (rate(capstan_consumer_send_back_messages_total[{RATE}]))",
                                "{{consumer_group}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Dead letters per second",
                        [
                            (
                                f"sum by (consumer_group) (rate(rocketmq_send_to_dlq_messages_total[{RATE}]))",
                                "{{consumer_group}}",
                            )
                        ],
                        unit="ops",
                    ),
                ],
            ),
            (
                "Members",
                [
                    Panel(
                        "Members per group",
                        [
                            (
                                f"max by (consumer_group) (capstan_consumer_group_members{{{C}}})",
                                "{{consumer_group}}",
                            )
                        ],
                    ),
                    Panel(
                        "Rebalances (membership changes) in 15 minutes",
                        [
                            (
                                f"max by (consumer_group) (changes(capstan_consumer_group_members{{{C}}}[15m]))",
                                "{{consumer_group}}",
                            )
                        ],
                    ),
                ],
            ),
        ],
    ),
    Dashboard(
        "capstan-operator",
        "Capstan / Operator",
        "The operator's reconciles: how many, how long, and what failed.",
        [
            (
                "Reconciles",
                [
                    Panel(
                        "Reconciles per second by kind and outcome",
                        [
                            (
                                f"sum by (kind, outcome) (rate(capstan_operator_reconcile_seconds_count[{RATE}]))",
                                "{{kind}} {{outcome}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Reconcile time p95 by kind",
                        [
                            (
                                f"histogram_quantile(0.95, sum by (le, kind) (rate(capstan_operator_reconcile_seconds_bucket[{RATE}])))",
                                "{{kind}}",
                            )
                        ],
                        unit="s",
                    ),
                    Panel(
                        "Errors in the last hour by kind and error",
                        [
                            (
                                "sum by (kind, error) (increase(capstan_operator_reconcile_errors_total[1h]))",
                                "{{kind}} {{error}}",
                            )
                        ],
                    ),
                ],
            ),
        ],
        [],
    ),
]


def variable(name: str) -> dict[str, Any]:
    source = {
        "cluster": ("capstan_commitlog_max_offset_bytes", "cluster", "Broker group"),
        "group": ("capstan_controller_master_epoch", "group", "Group (controller)"),
    }[name]
    query = f"label_values({source[0]}, {source[1]})"
    return {
        "name": name,
        "label": source[2],
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "sort": 1,
        "hide": 0,
    }


def render(d: Dashboard) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    next_id, y = 1, 0
    for row_title, row in d.rows:
        panels.append(
            {"id": next_id, "type": "row", "title": row_title, "collapsed": False,
             "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []}
        )  # fmt: skip
        next_id, y, x = next_id + 1, y + 1, 0
        for p in row:
            if x + p.width > 24:
                x, y = 0, y + 8
            panels.append(
                {
                    "id": next_id,
                    "type": p.kind,
                    "title": p.title,
                    "description": p.description,
                    "datasource": DATASOURCE,
                    "gridPos": {"h": 8, "w": p.width, "x": x, "y": y},
                    "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                    "options": {"legend": {"displayMode": "list", "placement": "bottom"}}
                    if p.kind == "timeseries"
                    else {"reduceOptions": {"calcs": ["lastNotNull"]}},
                    "targets": [
                        {
                            "refId": chr(ord("A") + i),
                            "datasource": DATASOURCE,
                            "expr": expr,
                            "legendFormat": legend,
                        }
                        for i, (expr, legend) in enumerate(p.queries)
                    ],
                }
            )
            next_id, x = next_id + 1, x + p.width
        y += 8
    return {
        "uid": d.uid,
        "title": d.title,
        "description": d.description,
        "tags": ["capstan"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                *(variable(v) for v in d.variables),
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def files() -> dict[str, str]:
    return {
        f"{d.uid}.json": json.dumps(render(d), indent=2, ensure_ascii=False) + "\n"
        for d in DASHBOARDS
    }


def main(argv: list[str]) -> int:
    wanted = files()
    if argv[1:] == ["--check"]:
        stale = [
            name
            for name, text in wanted.items()
            if not (OUT / name).is_file() or (OUT / name).read_text() != text
        ]
        extra = sorted(p.name for p in OUT.glob("*.json") if p.name not in wanted)
        if stale or extra:
            print(f"dashboards out of date: {stale + extra}; run scripts/gen_dashboards.py")
            return 1
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for p in OUT.glob("*.json"):
        if p.name not in wanted:
            p.unlink()
    for name, text in wanted.items():
        (OUT / name).write_text(text)
    print(f"wrote {len(wanted)} dashboards to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
