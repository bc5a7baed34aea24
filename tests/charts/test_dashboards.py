"""The Grafana dashboards' structure (Grafana does not install here; their queries are run
against a real Prometheus in test_monitoring_on_a_cluster.py): one ConfigMap each with the
sidecar's label, the data source a variable every panel uses, unique panel ids, panels that
fit the grid without overlapping, and only defined variables in queries."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.charts.helm import CHART, render

DASHBOARDS = CHART / "files" / "dashboards"


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def targets(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for p in board["panels"] for t in p.get("targets", [])]


def test_the_chart_ships_each_dashboard_in_a_configmap_for_the_sidecar(tmp_path: Path) -> None:
    maps = [
        o
        for o in render(tmp_path, "--set", "monitoring.dashboards.enabled=true")
        if o["kind"] == "ConfigMap"
    ]
    shipped = {}
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert m["metadata"]["annotations"]["grafana_folder"] == "Capstan"
        ((name, text),) = m["data"].items()
        shipped[name] = json.loads(text)
    assert shipped == dashboards()
    assert {b["title"] for b in shipped.values()} == {
        "Capstan / Overview",
        "Capstan / Broker",
        "Capstan / HA",
        "Capstan / Consumer groups",
        "Capstan / Operator",
    }


def test_every_dashboard_is_well_formed() -> None:
    uids = set()
    for name, board in dashboards().items():
        assert board["uid"] not in uids and len(board["uid"]) <= 40, name
        uids.add(board["uid"])
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: panel ids repeat"
        cells: set[tuple[int, int]] = set()
        for panel in board["panels"]:
            box = panel["gridPos"]
            assert box["x"] >= 0 and box["x"] + box["w"] <= 24, (name, panel["title"])
            covered = {
                (x, y)
                for x in range(box["x"], box["x"] + box["w"])
                for y in range(box["y"], box["y"] + box["h"])
            }
            assert not covered & cells, f"{name}: {panel['title']} overlaps another panel"
            cells |= covered
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            refs = [t["refId"] for t in panel["targets"]]
            assert panel["targets"] and len(refs) == len(set(refs)), (name, panel["title"])
        for target in targets(board):
            assert target["datasource"]["uid"] == "${datasource}"
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= set(variables), (name, target["expr"], used)
