#!/usr/bin/env bash
# A real one-node Kubernetes 1.20.2 on this machine, for the e2e suite and the tests that need
# running pods (tests/kube/node.py says what runs and what it changes).
#
#   bash scripts/k8s_node.sh start DIR   # last lines printed: an `export` of PATH (kubectl
#                                        # 1.20.2, helm) and KUBECONFIG; the kubeconfig's path
#   bash scripts/k8s_node.sh stop DIR    # stops it and undoes every change to the machine
#   bash scripts/k8s_node.sh prepare     # only the packages and binaries (the test command)
#
# start installs the Debian packages it needs, builds the Kubernetes binaries once
# (scripts/k8s_tools.sh, cached) and the images (scripts/k8s_images.sh, cached in the node's
# docker store), then starts the node. One node per machine: a second start says which DIR
# holds it. Needs root (bridges, iptables, mounts).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1

usage() { echo "usage: bash scripts/k8s_node.sh start|stop DIR, or prepare" >&2; exit 2; }
fail() { echo "error: node: $*" >&2; exit 1; }
action=${1:-}
dir=${2:-}
case "$action $#" in
    "start 2" | "stop 2" | "prepare 1") ;;
    *) usage ;;
esac
[[ $(id -u) -eq 0 ]] || fail "needs root: it makes bridges, iptables rules and mounts"
[[ -x .venv/bin/python ]] || bash scripts/setup.sh

if [[ $action == stop ]]; then
    exec .venv/bin/python -P tests/kube/node.py stop "$dir"
fi

# gcc builds the node's pause program (scripts/k8s_images.sh), and its test builds it too.
packages=(docker.io runc containernetworking-plugins dnsmasq-base iptables nftables conntrack
          jq mmdebstrap openssl gcc libc6-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "== node: installing ${missing[*]} with apt"
    # Nothing installed may start on its own (docker.io would start a dockerd of its own).
    policy=/usr/sbin/policy-rc.d
    made_policy=""
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; made_policy=1
    fi
    apt-get update -qq >/dev/null || fail "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
        >/dev/null || fail "apt-get install ${missing[*]} failed"
    [[ -z $made_policy ]] || rm -f "$policy"
fi
bash scripts/k8s_tools.sh
[[ $action == prepare ]] && exit 0
# Helm, for the README's quickstart on this node (cached; the line start ends with puts it
# on PATH with the cluster's kubectl).
bash scripts/chart_tools.sh

mkdir -p "$dir"
exec .venv/bin/python -P tests/kube/node.py start "$dir"
