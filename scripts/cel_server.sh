#!/usr/bin/env bash
# An API server that enforces the CRDs' CEL rules (x-kubernetes-validations), for
# tests/operator/test_cel_rules_for_real.py: apiextensions-apiserver 1.36, built from Debian
# sid's Go packages in a throwaway sid chroot (the kube-apiserver 1.20 of scripts/k8s_tools.sh
# drops the rules: it predates CEL validation). Built once and cached in
# ${XDG_CACHE_HOME:-~/.cache}/capstan/apiextensions-apiserver-1.36, beside a file naming the
# Debian package it was built from; later runs return at once.
# The first build takes about 6 minutes on 2 cores (2 to fetch, 4 to compile), 3.5 GB of
# scratch disk under /var/tmp and 1.3 GB of memory. Needs root (the chroot).
#
# Exit status 3: sid's packages could not be fetched (the line printed says why); the build
# is optional, and the tests that need the server say how to get it.
set -euo pipefail

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/capstan/apiextensions-apiserver-1.36"
BIN="$CACHE/apiextensions-apiserver"
VERSION_FILE="$CACHE/version"
PACKAGE=golang-k8s-apiextensions-apiserver-dev
SCRATCH_MB=4500

step() { echo "== cel server: $*"; }
fail() { echo "error: cel server: $*" >&2; exit 1; }
unfetchable() { echo "error: cel server: $*" >&2; exit 3; }

if [[ -x $BIN && -s $VERSION_FILE ]]; then
    step "cached: $BIN ($(head -1 "$VERSION_FILE"))"
    exit 0
fi
[[ $(id -u) -eq 0 ]] || fail "needs root: it builds in a chroot"

if ! command -v mmdebstrap >/dev/null; then
    step "installing mmdebstrap with apt"
    apt-get update -qq >/dev/null || fail "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap \
        >/dev/null || fail "apt-get install mmdebstrap failed"
fi
free_mb=$(df --output=avail -m /var/tmp | tail -1 | tr -d ' ')
((free_mb >= SCRATCH_MB)) || fail "needs ${SCRATCH_MB} MB free under /var/tmp, has ${free_mb} MB"

work=$(mktemp -d /var/tmp/capstan-cel-server.XXXXXX)
root="$work/sid"
remove_work() {
    # A mount left inside the chroot (a failed mmdebstrap) goes first; --one-file-system then
    # keeps rm from ever following one into the machine's own files.
    findmnt -rn -o TARGET | grep -F "$work/" | sort -r | xargs -r umount -l || true
    rm -rf --one-file-system "$work"
}
trap remove_work EXIT
started=$(date +%s)

step "fetching golang-go and $PACKAGE from Debian sid into a chroot (about 2 minutes, 3.5 GB)"
# sid's Release file can be past its Valid-Until by this machine's clock.
if ! mmdebstrap --variant=minbase --aptopt='Acquire::Check-Valid-Until "false"' \
    --include="golang-go,$PACKAGE" sid "$root" >"$work/fetch.log" 2>&1; then
    if grep -q "Unable to locate package $PACKAGE" "$work/fetch.log"; then
        unfetchable "Debian sid no longer has $PACKAGE (apt: Unable to locate package $PACKAGE)"
    fi
    apt_error=$(grep -m1 -E '^(E|W): ' "$work/fetch.log" || tail -1 "$work/fetch.log")
    unfetchable "could not fetch Debian sid's packages: $apt_error"
fi
version=$(chroot "$root" dpkg-query -W -f='${Version}' "$PACKAGE") \
    || fail "no $PACKAGE in the chroot"
fetched=$(date +%s)

step "building apiextensions-apiserver from $PACKAGE $version (about 4 minutes, once)"
# Nothing is mounted in the chroot (no /proc), so the go command cannot find its GOROOT from
# its own path, and runs its compiler with stdin on a /dev/null that minbase may lack.
[[ -e $root/usr/lib/go/bin/go ]] || fail "no /usr/lib/go/bin/go in the chroot"
[[ -e $root/dev/null ]] || mknod -m 666 "$root/dev/null" c 1 3
cat >"$root/build.sh" <<'EOF'
set -eu
export GOROOT=/usr/lib/go HOME=/build GOCACHE=/build/cache GOFLAGS= GOPROXY=off
go telemetry off 2>/dev/null || true
go version >/build/go-version
mkdir -p /build/gopath/src/k8s.io
cp -r /usr/share/gocode/src/k8s.io/apiextensions-apiserver /build/gopath/src/k8s.io/
cd /build
GO111MODULE=off GOPATH=/build/gopath:/usr/share/gocode CGO_ENABLED=0 \
    go build -trimpath -ldflags "-s -w" -o apiextensions-apiserver k8s.io/apiextensions-apiserver
EOF
chroot "$root" /bin/sh /build.sh >"$work/build.log" 2>&1 \
    || { tail -20 "$work/build.log" >&2; fail "go build failed"; }
go_version=$(cat "$root/build/go-version")
built=$(date +%s)

# Into the cache in one rename, so a half-copied binary never looks built.
mkdir -p "$CACHE"
staged=$(mktemp "$CACHE/apiextensions-apiserver.XXXXXX")
cp "$root/build/apiextensions-apiserver" "$staged"
chmod 755 "$staged"
printf '%s %s (Debian sid), built with %s on %s\n' "$PACKAGE" "$version" "$go_version" \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$VERSION_FILE"
mv "$staged" "$BIN"
size_mb=$(( $(stat -c %s "$BIN") / 1024 / 1024 ))
step "fetched in $((fetched - started)) s, built in $((built - fetched)) s: ${size_mb} MB"
step "cached: $BIN ($(head -1 "$VERSION_FILE"))"
