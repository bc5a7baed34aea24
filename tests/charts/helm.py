"""The real Helm 3 binary the chart's tests run (scripts/chart_tools.sh fetches and caches it),
and what it renders, as objects."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "capstan"
FULL_VALUES = Path(__file__).with_name("full-values.yaml")
HELM_VERSION = "3.17.2"


def helm_binary() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    found = cache / "capstan" / "helm" / HELM_VERSION / "helm"
    if not found.is_file():
        raise FileNotFoundError(f"no Helm at {found}: run `bash scripts/chart_tools.sh` first")
    return found


def helm(*args: str, scratch: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """Run Helm with its cache, config and data in `scratch`; the caller checks returncode."""
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(scratch / "cache"),
        "HELM_CONFIG_HOME": str(scratch / "config"),
        "HELM_DATA_HOME": str(scratch / "data"),
    }
    return subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, timeout=timeout_s, env=env
    )


def render(
    scratch: Path,
    *options: str,
    namespace: str = "capstan",
    crds: bool = False,
    release: str = "capstan",
) -> list[dict[str, Any]]:
    """`helm template` of the chart as `release`, its objects in order."""
    args = ["template", release, str(CHART), "--namespace", namespace, *options]
    if crds:
        args.append("--include-crds")
    done = helm(*args, scratch=scratch)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]
