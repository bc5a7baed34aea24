#!/usr/bin/env bash
# Build Capstan's images for the local one-node Kubernetes (kubelet with dockershim: images
# live in a dockerd's store, pods use imagePullPolicy: Never) without a network in any
# `docker build`:
#   local/debian:bookworm         Debian bookworm minbase, python3 and python3-venv (mmdebstrap)
#   local/debian-java:bookworm    the same plus Java 17 (openjdk-17-jre-headless) and procps
#   local/pause:3.4.1             the pod sandbox: scripts/pause/pause.c, static, FROM scratch
#   local/capstan:TAG             Dockerfile on local/debian:bookworm; VERSION's also tagged
#                                 capstan:VERSION, the chart's default image
#   local/capstan-spark:VERSION   spark/Dockerfile on local/debian-java:bookworm
# Usage: DOCKER_HOST=unix:///path/docker.sock bash scripts/k8s_images.sh [TAG...]
# TAGs default to VERSION and VERSION-rev2 (VERSION from pyproject.toml): the same content
# with a distinct image id, for rolling upgrades. The base root filesystems and the wheels
# (from the repo's .venv pip, scripts/setup.sh) are downloaded once and cached under
# ${XDG_CACHE_HOME:-~/.cache}/capstan/; an image whose inputs did not change is not rebuilt
# (its label io.capstan.inputs holds their hash); the images a rebuild left untagged are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1
repo=$PWD
cache=${XDG_CACHE_HOME:-$HOME/.cache}/capstan
images_cache=$cache/images
mirror=${CAPSTAN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${CAPSTAN_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
# The classic builder: the one dockerd 20.10 runs without BuildKit, the same on every client.
export DOCKER_BUILDKIT=0
INPUTS_LABEL=io.capstan.inputs
BASE=local/debian:bookworm
JAVA_BASE=local/debian-java:bookworm
PAUSE=local/pause:3.4.1
built=()
timings=()

say() { echo "== images: $*"; }
fail() {
    echo "error: images: $*" >&2
    exit 1
}
now() { date +%s.%N; }
seconds_since() { awk -v start="$1" -v end="$(now)" 'BEGIN { printf "%.1f", end - start }'; }

# Runs "$@" as one named step and remembers how long it took.
step() {
    local name=$1 start took
    shift
    say "$name ..."
    start=$(now)
    "$@"
    took=$(seconds_since "$start")
    timings+=("$(printf '%-16s %7s s' "$name" "$took")")
    say "$name took $took s"
}

install_missing() {
    local wanted=() sudo=""
    command -v mmdebstrap >/dev/null || wanted+=(mmdebstrap)
    command -v docker >/dev/null || wanted+=(docker.io)
    command -v gcc >/dev/null || wanted+=(gcc)
    compgen -G "/usr/lib/*/libc.a" >/dev/null || wanted+=(libc6-dev)
    [ ${#wanted[@]} -eq 0 ] && return
    say "installing ${wanted[*]} with apt"
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends "${wanted[@]}" >/dev/null
}

check_daemon() {
    local version
    version=$(docker version --format '{{.Server.Version}}' 2>/dev/null) \
        || fail "no docker daemon answers at ${DOCKER_HOST:-the default socket}; set DOCKER_HOST"
    say "docker daemon $version at ${DOCKER_HOST:-the default socket}"
}

# The value of an image's inputs label, empty when the image is missing.
inputs_of() {
    docker image inspect --format "{{ index .Config.Labels \"$INPUTS_LABEL\" }}" "$1" \
        2>/dev/null || true
}

up_to_date() {
    if [ "$(inputs_of "$1")" = "$2" ]; then
        say "$1 is up to date (inputs $2)"
        return 0
    fi
    return 1
}

# A Debian bookworm root filesystem with the packages named, as a cached tarball, imported
# into the daemon as IMAGE. Docs, man pages and translations are left out; the man1 folder
# stays, as Java's alternatives link into it.
debian_base() {
    local image=$1 packages=$2 key tarball
    shift 2
    key=$(printf '%s\n' "$packages" "$mirror" "$security_mirror" | sha256sum | cut -c1-16)
    tarball=$images_cache/debian-bookworm-$key.tar
    if [ ! -f "$tarball" ]; then
        say "mmdebstrap bookworm with $packages -> $tarball"
        mkdir -p "$images_cache"
        # shellcheck disable=SC2016  # the hook's $1 is the new root, for mmdebstrap to fill in
        mmdebstrap --variant=minbase --format=tar --include="$packages" \
            --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-include=/usr/share/doc/*/copyright' \
            --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' \
            --dpkgopt='path-exclude=/usr/share/info/*' \
            --essential-hook='mkdir -p "$1/usr/share/man/man1"' \
            bookworm "$tarball.part" \
            "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
            "deb $security_mirror bookworm-security main" </dev/null \
            || fail "mmdebstrap could not build $image"
        mv "$tarball.part" "$tarball"
    fi
    up_to_date "$image" "$key" && return
    docker import --change "LABEL $INPUTS_LABEL=$key" \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' "$@" --change 'CMD ["bash"]' \
        "$tarball" "$image" >/dev/null || fail "docker import of $tarball failed"
    built+=("$image")
}

python_base() { debian_base "$BASE" python3,python3-venv,ca-certificates; }

java_base() {
    debian_base "$JAVA_BASE" python3,python3-venv,ca-certificates,openjdk-17-jre-headless,procps \
        --change "ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)"
}

# docker build without a network, its output in a log shown when it fails.
build() {
    local image=$1 inputs=$2 log
    shift 2
    log=$images_cache/logs/${image//[\/:]/_}.log
    mkdir -p "$images_cache/logs"
    if ! docker build --network=none --label "$INPUTS_LABEL=$inputs" --tag "$image" "$@" \
        >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        fail "docker build of $image failed (whole log: $log)"
    fi
    built+=("$image")
}

pause_image() {
    local context inputs
    inputs=$(cat scripts/pause/pause.c scripts/pause/Dockerfile | sha256sum | cut -c1-16)
    up_to_date "$PAUSE" "$inputs" && return
    context=$work/pause
    mkdir -p "$context"
    gcc -static -O2 -Wall -Wextra -Werror -o "$context/pause" scripts/pause/pause.c \
        || fail "gcc could not build scripts/pause/pause.c"
    cp scripts/pause/Dockerfile "$context/"
    build "$PAUSE" "$inputs" "$context"
}

# Requirements pyproject.toml names, one a line: build-system.requires, project.dependencies or
# an extra of project.optional-dependencies.
requirements() {
    "$repo/.venv/bin/python" -c 'import sys, tomllib
found = tomllib.load(open("pyproject.toml", "rb"))
for key in sys.argv[1].split("."):
    found = found[key]
print(*found, sep="\n")' "$1"
}

# Wheels of what the images install from pyproject.toml (and of the build backend, for
# `pip install .` in the image): one folder for the capstan image, one with the spark extra
# added. Keyed by pyproject.toml, which names them all. Capstan's own wheel is not among
# them: the images build it from the sources they copy.
wheelhouse() {
    local python=$repo/.venv/bin/python key backend dependencies spark
    [ -x "$python" ] || fail "no .venv: run scripts/setup.sh first"
    "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
        || fail ".venv's python is not 3.11, the Python of Debian bookworm's images"
    key=$(sha256sum pyproject.toml | cut -c1-16)
    wheels=$cache/wheelhouse/$key
    # Wheels of an older pyproject.toml are never used again (about 0.5 GB each).
    mkdir -p "$cache/wheelhouse"
    find "$cache/wheelhouse" -mindepth 1 -maxdepth 1 ! -name "$key" -exec rm -rf {} +
    [ -f "$wheels/complete" ] && { say "wheelhouse $wheels is ready"; return; }
    mapfile -t backend < <(requirements build-system.requires)
    mapfile -t dependencies < <(requirements project.dependencies)
    mapfile -t spark < <(requirements project.optional-dependencies.spark)
    rm -rf "$wheels" && mkdir -p "$wheels"
    "$python" -m pip wheel --quiet --wheel-dir "$wheels/capstan" \
        "${backend[@]}" "${dependencies[@]}" || fail "pip wheel failed"
    cp -al "$wheels/capstan" "$wheels/spark"
    "$python" -m pip wheel --quiet --find-links "$wheels/spark" --wheel-dir "$wheels/spark" \
        "${backend[@]}" "${dependencies[@]}" "${spark[@]}" || fail "pip wheel failed (spark)"
    touch "$wheels/complete"
}

# A build context in a temporary folder: what .dockerignore lets through, and the wheels.
context_with() {
    local context=$1 wheel_folder=$2
    mkdir -p "$context"
    tar -C "$repo" --exclude=__pycache__ --exclude='*.pyc' -cf - Dockerfile .dockerignore \
        pyproject.toml README.md capstan broker controller operator client spark bench \
        | tar -C "$context" -xf -
    cp -al "$wheel_folder" "$context/wheelhouse" 2>/dev/null || cp -a "$wheel_folder" "$context/wheelhouse"
}

# The hash of a context's files (the wheels by name and size) and of the base image.
inputs_hash() {
    local context=$1 base=$2
    {
        (cd "$context" && find . -path ./wheelhouse -prune -o -type f -print0 \
            | LC_ALL=C sort -z | xargs -0 sha256sum)
        (cd "$context/wheelhouse" && find . -type f -printf '%p %s\n' | LC_ALL=C sort)
        docker image inspect --format '{{.Id}}' "$base"
    } | sha256sum | cut -c1-16
}

capstan_images() {
    local context=$work/capstan inputs tag
    context_with "$context" "$wheels/capstan"
    for tag in "${tags[@]}"; do
        inputs=$(printf '%s %s' "$(inputs_hash "$context" "$BASE")" "$tag" | sha256sum | cut -c1-16)
        up_to_date "local/capstan:$tag" "$inputs" && continue
        build "local/capstan:$tag" "$inputs" --build-arg "BASE=$BASE" \
            --label "io.capstan.tag=$tag" "$context"
    done
    # The chart's default image (image.repository capstan, the chart's appVersion), so the
    # README's `helm install` runs as written on the project's node.
    if docker image inspect "local/capstan:$version" >/dev/null 2>&1; then
        docker tag "local/capstan:$version" "capstan:$version"
    fi
}

spark_image() {
    local context=$work/spark inputs image=local/capstan-spark:$version
    context_with "$context" "$wheels/spark"
    inputs=$(inputs_hash "$context" "$JAVA_BASE")
    if ! up_to_date "$image" "$inputs"; then
        build "$image" "$inputs" --build-arg "BASE=$JAVA_BASE" -f "$context/spark/Dockerfile" \
            "$context"
    fi
}

# A rebuilt image takes its tag from the old one, which stays in the store untagged: remove
# those (about 0.4 to 1.9 GB each, tens of GB after a few days of builds). Tagged images and
# the layers they use stay.
prune_untagged() {
    local freed
    freed=$(docker image prune --force | sed -n 's/^Total reclaimed space: //p')
    say "untagged images removed: ${freed:-0B} freed"
}

summary() {
    say "timings:"
    printf '    %s\n' "${timings[@]}"
    say "built: ${built[*]:-nothing, all up to date}"
    docker image ls --format '{{.Repository}}:{{.Tag}}  {{.ID}}  {{.Size}}' \
        --filter 'reference=local/*' | sed 's/^/    /'
}

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
[ -n "$version" ] || fail "no version in pyproject.toml"
tags=("$@")
[ ${#tags[@]} -gt 0 ] || tags=("$version" "$version-rev2")
wheels=""
mkdir -p "$images_cache"
# Build contexts live beside the cached wheels (same file system: hard links, not copies).
work=$(mktemp -d "$images_cache/work.XXXXXX")
trap 'rm -rf "$work"' EXIT
step "tools" install_missing
check_daemon
step "python base" python_base
step "java base" java_base
step "pause image" pause_image
step "wheelhouse" wheelhouse
step "capstan images" capstan_images
step "spark image" spark_image
step "prune" prune_untagged
summary
