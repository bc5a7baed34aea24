"""A real Prometheus (Debian's `prometheus` package, installed by scripts/chart_tools.sh) as a
child process of a test: its own config, data dir and port on 127.0.0.1. `scrape_config`
makes the config of static targets scraped every second; the e2e story passes its own
(pods found through the API server)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.broker.broker_process import free_port
from tests.charts.test_dashboards import dashboards, targets
from tests.tiers import process_tool
from tests.waiting import wait_until

RATE_WINDOW = "30s"
"""What Grafana's $__rate_interval becomes at a 1 s scrape, and then some."""


@process_tool
class Prometheus:
    def __init__(self, root: Path, config: dict[str, Any]) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.port = free_port()
        self.config = root / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Prometheus:
        binary = shutil.which("prometheus")
        assert binary, "no prometheus: run `bash scripts/chart_tools.sh` (Debian's package)"
        with (self.root / "prometheus.log").open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.root / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(self._ready, 30, "Prometheus to be ready")
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}" + (f"?{query}" if query else "")
        with urllib.request.urlopen(url, timeout=10) as r:
            answer = json.loads(r.read())
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's samples."""
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self, name: str) -> list[dict[str, Any]]:
        """The active alerts (pending or firing) of the rule named `name`."""
        found: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return [a for a in found if a["labels"].get("alertname") == name]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def scrape_config(jobs: dict[str, list[str]], rule_file: Path) -> dict[str, Any]:
    """A Prometheus config scraping each job's host:port targets every second; the
    `component` label names the job's part, as the chart's scrape config does."""
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rule_file)],
        "scrape_configs": [
            {
                "job_name": f"capstan-{job}",
                "static_configs": [{"targets": targets, "labels": {"component": job}}],
            }
            for job, targets in jobs.items()
        ],
    }


def panel_query(expr: str) -> str:
    """A panel's query as Grafana would send it with every variable at All."""
    expr = expr.replace("$__rate_interval", RATE_WINDOW)
    return re.sub(r"\$(\w+)", ".*", expr)


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b((?:rocketmq|capstan)_[a-z_]+)\b", expr))


def panels_without_data(prometheus: Prometheus) -> list[str]:
    """`dashboard: query` of every panel query of the chart's dashboards that returns
    nothing now."""
    return [
        f"{name}: {target['expr']}"
        for name, board in dashboards().items()
        for target in targets(board)
        if not prometheus.query(panel_query(target["expr"]))
    ]


def alert_rules(rule_file: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load(rule_file.read_text())
    return [r for g in spec["groups"] for r in g["rules"] if "alert" in r]


def rules_not_evaluated(prometheus: Prometheus, rule_file: Path) -> list[str]:
    """The alerts of `rule_file` that Prometheus has not evaluated without error."""
    groups = prometheus.api("rules")["groups"]
    evaluated = {r["name"]: r for g in groups for r in g["rules"]}
    return [
        f"{rule['alert']}: {(evaluated.get(rule['alert']) or {}).get('lastError', 'not loaded')}"
        for rule in alert_rules(rule_file)
        if (evaluated.get(rule["alert"]) or {}).get("health") != "ok"
    ]


def metrics_of_alerts_not_served(prometheus: Prometheus, rule_file: Path) -> list[str]:
    """`alert: metric` of every metric an alert of `rule_file` reads that no target serves."""
    return [
        f"{rule['alert']}: {metric}"
        for rule in alert_rules(rule_file)
        for metric in sorted(metric_names(rule["expr"]))
        if not prometheus.query(f"count({metric})")
    ]
