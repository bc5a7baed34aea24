#!/usr/bin/env bash
# The real Kubernetes the operator's tests run against: etcd (Debian etcd-server) and
# kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet and kubectl
# 1.20.2, built offline from Debian's `kubernetes` source package (no package registry we
# reach ships them), so the client is the cluster's own version (the node, the e2e story and
# the README's Kubernetes commands use it). Built once and cached under
# ${XDG_CACHE_HOME:-~/.cache}/capstan/kubernetes/1.20.2/bin; later runs return at once, and
# a cache missing some binaries builds only those. The first build takes about 12 minutes
# on 2 cores and 2.6 GB of scratch disk.
set -euo pipefail

VERSION=1.20.2
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/capstan/kubernetes/$VERSION"
BIN="$CACHE/bin"

step() { echo "== k8s tools: $*"; }
fail() { echo "error: k8s tools: $*" >&2; exit 1; }

BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl)
missing_binaries() {
    local b
    for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || echo "$b"; done
}
built() { [[ -z "$(missing_binaries)" ]]; }

if built && command -v etcd >/dev/null; then
    exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

packages=(golang-go make rsync jq golang-github-modern-go-reflect2-dev etcd-server openssl)
missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
    step "installing ${missing[*]} with apt"
    $SUDO apt-get update -qq >/dev/null || fail "apt-get update failed"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null \
        || fail "apt-get install ${missing[*]} failed"
fi
built && exit 0

work=$(mktemp -d "${TMPDIR:-/tmp}/capstan-k8s-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

step "fetching Debian's kubernetes source package (34 MB)"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
cat > sources.list <<EOF
deb-src [signed-by=$keyring] http://deb.debian.org/debian bookworm main
deb-src [signed-by=$keyring] http://deb.debian.org/debian-security bookworm-security main
EOF
mkdir -p lists/partial
apt_src=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
         -o "Dir::State::Lists=$work/lists")
apt-get "${apt_src[@]}" update -q >/dev/null 2>&1 || fail "apt-get update of the deb-src list failed"
apt-get "${apt_src[@]}" source --download-only kubernetes >/dev/null 2>&1 \
    || fail "apt-get source kubernetes failed"
tar xzf kubernetes_*.orig.tar.gz || fail "unpacking the source failed"
src=$(find . -maxdepth 1 -type d -name "kubernetes-$VERSION" | head -1)
[[ -n "$src" ]] || fail "no kubernetes-$VERSION folder in the source package"
cd "$src"

# The vendored reflect2 1.0.1 crashes under Go 1.19 on the first custom resource
# ("fatal error: fault"); Debian's 1.0.2 does not.
rm -rf vendor/github.com/modern-go/reflect2
cp -rL /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/
rm -f vendor/github.com/modern-go/reflect2/go.mod vendor/github.com/modern-go/reflect2/*_test.go

mapfile -t wanted < <(missing_binaries)
step "building ${wanted[*]} $VERSION (7 minutes on 2 idle cores for all of them, once)"
started=$(date +%s)
CGO_ENABLED=0 GOPROXY=off make WHAT="${wanted[*]/#/cmd/}" \
    > "$work/build.log" 2>&1 || { tail -20 "$work/build.log" >&2; fail "make failed"; }

# Into the cache in one rename, so a half-built cache never looks complete.
mkdir -p "$CACHE"
staged=$(mktemp -d "$CACHE/bin.XXXXXX")
for b in "${BINARIES[@]}"; do
    if [[ -x "_output/bin/$b" ]]; then cp "_output/bin/$b" "$staged/"; else cp "$BIN/$b" "$staged/"; fi
done
rm -rf "$BIN"
mv "$staged" "$BIN"
step "built in $(( $(date +%s) - started )) s, cached in $BIN"
