"""What an offset audit (audit.py) writes: `audit.json`, `audit.html` (a page a person reads,
with a lag chart per consumer group) and `audit.prom` (Prometheus text format, for
node_exporter's textfile collector), and what it pushes to a Pushgateway.

Metrics (all gauges, set by the last run):
  capstan_audit_last_run_timestamp_seconds, capstan_audit_last_run_duration_seconds,
  capstan_audit_last_run_ok (1 when no problem was found), capstan_audit_records_checked,
  capstan_audit_problems{kind} (every kind, 0 when none),
  capstan_audit_consumer_lag{consumer_group,broker_group,topic,queue_id},
  capstan_audit_consumer_lag_age_seconds{...} (0 when nothing is behind),
  capstan_audit_retry_messages{consumer_group}, capstan_audit_dlq_messages{consumer_group}.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, push_to_gateway, write_to_textfile

from capstan.spark.audit_findings import AuditReport, QueueLag

PUSH_JOB = "capstan_audit"


def metrics(report: AuditReport) -> CollectorRegistry:
    registry = CollectorRegistry()

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, labels, registry=registry)

    gauge("capstan_audit_last_run_timestamp_seconds", "When the last audit finished").set(
        report.finished_ms / 1000
    )
    gauge("capstan_audit_last_run_duration_seconds", "How long the last audit took").set(
        (report.finished_ms - report.started_ms) / 1000
    )
    gauge("capstan_audit_last_run_ok", "1 if the last audit found no problem").set(
        1 if report.ok else 0
    )
    gauge("capstan_audit_records_checked", "Records the last audit read").set(
        report.records_checked
    )
    problems = gauge("capstan_audit_problems", "Problems found, by kind", ("kind",))
    for kind, count in report.problem_counts().items():
        problems.labels(kind).set(count)
    where = ("consumer_group", "broker_group", "topic", "queue_id")
    lag = gauge("capstan_audit_consumer_lag", "Messages behind the committed offset", where)
    age = gauge(
        "capstan_audit_consumer_lag_age_seconds",
        "How long ago the oldest unconsumed message was stored",
        where,
    )
    for q in report.lags:
        labels = (q.consumer_group, q.broker_group, q.topic, str(q.queue_id))
        lag.labels(*labels).set(q.lag)
        age.labels(*labels).set(q.lag_age_s or 0)
    retry = gauge(
        "capstan_audit_retry_messages", "Messages in the retry topic", ("consumer_group",)
    )
    dlq = gauge(
        "capstan_audit_dlq_messages", "Messages in the dead-letter topic", ("consumer_group",)
    )
    for b in report.backlogs:
        retry.labels(b.consumer_group).set(b.retry_messages)
        dlq.labels(b.consumer_group).set(b.dlq_messages)
    return registry


def write_reports(report: AuditReport, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / "audit.json", directory / "audit.html", directory / "audit.prom"]
    written[0].write_text(json.dumps(report.to_json(), indent=1, default=str))
    written[1].write_text(render_html(report))
    write_to_textfile(str(written[2]), metrics(report))
    return written


def push(report: AuditReport, gateway: str, cluster: str) -> None:
    """Push the metrics to a Prometheus Pushgateway (replacing the job's previous ones)."""
    push_to_gateway(gateway, PUSH_JOB, metrics(report), grouping_key={"cluster": cluster})


def render_html(report: AuditReport) -> str:
    verdict = "no problem found" if report.ok else f"{len(report.problems)} problems found"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Capstan offset audit</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
        "td.l,th.l{text-align:left}.bad{color:#b00}.ok{color:#070}</style></head><body>",
        "<h1>Capstan offset audit</h1>",
        f"<p class='{'ok' if report.ok else 'bad'}'><b>{verdict}</b>: "
        f"{report.records_checked} records on {report.replicas_read} replicas of "
        f"{len(report.broker_groups)} broker groups, {len(report.topics_read)} topics, "
        f"{(report.finished_ms - report.started_ms) / 1000:.1f} s.</p>",
    ]
    if report.problems:
        parts.append("<h2>Problems</h2><table><tr>")
        parts += [
            f"<th class='l'>{h}</th>" for h in ("kind", "where", "replica", "what", "offsets")
        ]
        parts.append("</tr>")
        for p in report.problems:
            cells = (
                p.kind,
                f"{p.broker_group} {p.topic} q{p.queue_id}",
                p.replica,
                p.detail,
                ", ".join(map(str, p.offsets)),
            )
            parts.append("<tr>" + "".join(f"<td class='l'>{_e(c)}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
    groups: dict[str, list[QueueLag]] = {}
    for q in report.lags:
        groups.setdefault(q.consumer_group, []).append(q)
    backlog = {b.consumer_group: b for b in report.backlogs}
    for group, lags in sorted(groups.items()):
        b = backlog.get(group)
        parts.append(f"<h2>Consumer group {_e(group)}</h2>")
        if b is not None:
            parts.append(f"<p>retry: {b.retry_messages}, dead letters: {b.dlq_messages}</p>")
        parts.append(_lag_chart(lags))
        parts.append("<table><tr>")
        heads = ("topic", "broker group", "queue", "committed", "min", "max", "lag", "lag age s")
        parts += [f"<th>{h}</th>" for h in heads]
        parts.append("</tr>")
        for q in sorted(lags, key=lambda q: (q.topic, q.broker_group, q.queue_id)):
            row: tuple[object, ...] = (
                q.topic,
                q.broker_group,
                q.queue_id,
                q.committed,
                q.min_offset,
                q.max_offset,
                q.lag,
                "" if q.lag_age_s is None else f"{q.lag_age_s:.1f}",
            )
            parts.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _lag_chart(lags: list[QueueLag]) -> str:
    """An SVG bar chart: one bar per (topic, broker group, queue), its length the lag."""
    rows = sorted(lags, key=lambda q: (q.topic, q.broker_group, q.queue_id))
    top = max((q.lag for q in rows), default=0) or 1
    bar_h, label_w, width = 16, 260, 420
    svg = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{label_w + width + 80}' "
        f"height='{bar_h * len(rows) + 4}' role='img' aria-label='lag per queue'>"
    ]
    for i, q in enumerate(rows):
        y = i * bar_h + 2
        w = round(width * q.lag / top)
        label = _e(f"{q.topic} {q.broker_group} q{q.queue_id}")
        svg.append(f"<text x='0' y='{y + 12}' font-size='12'>{label}</text>")
        svg.append(f"<rect x='{label_w}' y='{y}' width='{w}' height='{bar_h - 3}' fill='#4a7ebb'/>")
        svg.append(f"<text x='{label_w + w + 4}' y='{y + 12}' font-size='12'>{q.lag}</text>")
    svg.append("</svg>")
    return "".join(svg)


def _e(value: Any) -> str:
    return html.escape(str(value))
