#!/usr/bin/env bash
# The end-to-end story (e2e/): helm install, a 3-replica BrokerGroup, clients inside and
# outside, faults, every acknowledged message read back. Run by the README's test command.
#
#   bash scripts/e2e.sh            # on a real one-node cluster started here (scripts/k8s_node.sh),
#                                  # stopped and the machine restored at the end, pass or fail
#   KUBECONFIG=... bash scripts/e2e.sh   # unchanged against that cluster (e2e/README.md says
#                                  # what it needs: the images, a default StorageClass)
#
# The report (steps, timings, acknowledged / lost / duplicated, longest send gap) is written
# to $E2E_OUTPUT/report.json (default e2e-output/) and printed as a table.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1
[[ -x .venv/bin/python ]] || bash scripts/setup.sh
bash scripts/chart_tools.sh
export E2E_OUTPUT=${E2E_OUTPUT:-$PWD/e2e-output}
rm -rf "$E2E_OUTPUT" && mkdir -p "$E2E_OUTPUT"

if [[ -z ${KUBECONFIG:-} ]]; then
    node_dir=$(mktemp -d "${TMPDIR:-/tmp}/capstan-e2e-node.XXXXXX")
    stop_node() {
        local rc=$?
        cp -r "$node_dir/logs" "$E2E_OUTPUT/node-logs" 2>/dev/null || true
        bash scripts/k8s_node.sh stop "$node_dir" || rc=1
        rm -rf "$node_dir"
        exit "$rc"
    }
    trap stop_node EXIT
    trap 'exit 130' INT TERM
    bash scripts/k8s_node.sh start "$node_dir" | tee "$E2E_OUTPUT/node-start.log"
    KUBECONFIG=$(tail -1 "$E2E_OUTPUT/node-start.log")
    export KUBECONFIG
    export E2E_NODE_DOCKER="$node_dir/docker.sock"
    export E2E_NODE_DIR="$node_dir"  # the node-loss step stops the second node's kubelet
fi

# kubectl 1.20.2, the node's own version (scripts/k8s_tools.sh), where it has been built.
kubectl_bin="${XDG_CACHE_HOME:-$HOME/.cache}/capstan/kubernetes/1.20.2/bin"
[[ -x "$kubectl_bin/kubectl" ]] && export PATH="$kubectl_bin:$PATH"
echo "== e2e story against $(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
# Every wait inside a step is bounded by progress (e2e/cluster.py wait_progressing) or by a
# promise of e2e/bounds.py; the hour per step only guards against a hang outside them.
.venv/bin/python -m pytest e2e -m e2e -x -p no:cacheprovider -o addopts="" --timeout 3600 -s "$@"
