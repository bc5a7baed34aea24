"""The chart's alerts with the real promtool: the PrometheusRule the chart renders is a valid
rule file, every alert fires when it should and stays quiet when it should not
(alerts_test.yaml), and each has a runbook section that its runbook_url points at."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.charts.helm import CHART, REPO, helm, render

TESTS = Path(__file__).with_name("alerts_test.yaml")
RUNBOOK = REPO / "docs" / "runbook.md"


def rendered_rules(scratch: Path, *options: str) -> dict[str, Any]:
    (rule,) = [
        o
        for o in render(scratch, "--set", "monitoring.rules.enabled=true", *options)
        if o["kind"] == "PrometheusRule"
    ]
    spec: dict[str, Any] = rule["spec"]
    return spec


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    found = shutil.which("promtool")
    assert found, "no promtool: run `bash scripts/chart_tools.sh` (Debian's prometheus)"
    return subprocess.run([found, *args], capture_output=True, text=True, timeout=120)


def alert_names(spec: dict[str, Any]) -> list[str]:
    return [r["alert"] for g in spec["groups"] for r in g["rules"] if "alert" in r]


def test_the_rules_are_valid_and_every_alert_fires_and_stays_quiet_as_tested(
    tmp_path: Path,
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rendered_rules(tmp_path), sort_keys=False))
    checked = promtool("check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shutil.copy(TESTS, tmp_path / TESTS.name)
    tested = promtool("test", "rules", str(tmp_path / TESTS.name))
    assert tested.returncode == 0, tested.stdout + tested.stderr

    names = alert_names(yaml.safe_load(rules.read_text()))
    cases = yaml.safe_load(TESTS.read_text())["tests"]
    fired = {t["alertname"] for c in cases for t in c["alert_rule_test"] if t["exp_alerts"]}
    quiet = {t["alertname"] for c in cases for t in c["alert_rule_test"] if not t["exp_alerts"]}
    assert set(names) == fired == quiet  # each alert tested both ways


def test_every_alert_has_a_runbook_section_and_points_at_it(tmp_path: Path) -> None:
    spec = rendered_rules(tmp_path, "--set", "monitoring.rules.runbookBaseUrl=https://x/run")
    headings = {
        re.sub(r"[^a-z0-9-]", "", line.lstrip("#").strip().lower().replace(" ", "-"))
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("## ")
    }
    for group in spec["groups"]:
        for rule in group["rules"]:
            anchor = rule["alert"].lower()
            assert anchor in headings, f"docs/runbook.md has no section {rule['alert']}"
            assert rule["annotations"]["runbook_url"] == f"https://x/run#{anchor}"
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
            assert rule["labels"]["severity"] in ("warning", "critical")


def test_thresholds_come_from_the_values(tmp_path: Path) -> None:
    spec = rendered_rules(tmp_path, "--set", "monitoring.rules.consumerLagMessages=500")
    (lag,) = [
        r for g in spec["groups"] for r in g["rules"] if r.get("alert") == "CapstanConsumerLagHigh"
    ]
    assert "> 500)" in lag["expr"]


def test_how_long_a_group_may_be_without_a_master_comes_from_the_values(tmp_path: Path) -> None:
    def no_master(*options: str) -> dict[str, Any]:
        spec = rendered_rules(tmp_path, *options)
        (rule,) = [
            r
            for g in spec["groups"]
            for r in g["rules"]
            if r.get("alert") == "CapstanGroupWithoutMaster"
        ]
        return rule

    assert no_master()["for"] == "1m"
    rule = no_master("--set", "monitoring.rules.groupWithoutMasterFor=15s")
    assert rule["for"] == "15s" and "over 15s" in rule["annotations"]["description"]
    refused = helm(
        "template", "capstan", str(CHART), "--set", "monitoring.rules.enabled=true",
        "--set", "monitoring.rules.groupWithoutMasterFor=a minute",
        scratch=tmp_path,
    )  # fmt: skip
    assert refused.returncode != 0 and "groupWithoutMasterFor" in refused.stderr
