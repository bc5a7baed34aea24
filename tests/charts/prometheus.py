"""A real Prometheus (Debian's `prometheus` package, installed by scripts/chart_tools.sh) as a
child process of a test: its own config, data dir and port on 127.0.0.1, scraping the given
targets every second and evaluating the given rule file."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.broker.broker_process import free_port
from tests.tiers import process_tool
from tests.waiting import wait_until


@process_tool
class Prometheus:
    def __init__(self, root: Path, jobs: dict[str, list[str]], rule_file: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.port = free_port()
        self.config = root / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(scrape_config(jobs, rule_file), sort_keys=False))
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
