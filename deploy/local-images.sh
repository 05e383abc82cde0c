#!/usr/bin/env bash
# Prepare, idempotently, what a machine that cannot pull from image registries needs for
# `docker compose up -d --build --wait` (docker-compose.yml), then write the settings
# that point compose at it into .env (read by compose; ignored by git):
#
#   bash deploy/local-images.sh          # as root (or with sudo)
#   docker compose up -d --build --wait
#
# 1. Docker Engine (Debian's docker.io) and debootstrap, with apt-get, when missing.
# 2. Compose v2 when `docker compose` is missing: Debian 13 (trixie)'s docker-compose
#    package (one static Go binary) fetched with `apt-get download` under a PRIVATE apt
#    configuration (its own sources list, lists and cache under the cache directory, as
#    scripts/build-libfuse.sh does: the host's apt state is untouched, nothing of trixie is
#    installed), unpacked with dpkg-deb -x and placed as a CLI plugin.
# 3. dockerd, started in the background (niced; log in the cache directory) when none
#    answers.
# 4. The base images docker-compose.yml names, built locally under hycache-local/*:
#      debian:bookworm  debootstrap --variant=minbase bookworm + docker import
#                       (stands for debian:bookworm-slim)
#      debian:trixie    the same for trixie (only under the Node.js image)
#      redis:7          Debian's redis-server            (stands for redis:7.2-bookworm)
#      postgres:15      Debian's postgresql-15 + deploy/local/postgres-entrypoint.sh
#                       (the official image's POSTGRES_* variables; for postgres:16-bookworm)
#      node:20          trixie's nodejs/npm (>= 20.19)   (for node:20-bookworm-slim)
#      uv:VERSION       the uv binary of PyPI's uv wheel (for ghcr.io/astral-sh/uv)
#    An image that exists is kept (docker's store is the cache); the debootstrap root file
#    systems are also kept as tarballs in the cache directory.
# 5. .env: HYCACHE_*_IMAGE pointing at those images, and HYCACHE_CA_BUNDLE = the host's CA
#    bundle (build secret: PyPI/npm over HTTPS from the build containers).
#
# Environment: HYCACHE_CACHE (default ~/.cache/hycache), HYCACHE_DEBIAN_MIRROR (default:
# the host's apt mirror), HYCACHE_CA_BUNDLE (default /etc/ssl/certs/ca-certificates.crt).
# --check: only report whether Docker can run here (exit 0) or why not (exit 3).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../scripts/versions.env
source "$REPO/scripts/versions.env"
CACHE="${HYCACHE_CACHE:-$HOME/.cache/hycache}/docker"
CA_BUNDLE="${HYCACHE_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
COMPOSE_DEB_VERSION="${COMPOSE_DEB_VERSION:-2.26.1-4}"
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins
say() { echo "local-images: $*" >&2; }
die() { echo "local-images: $*" >&2; exit "${2:-1}"; }
as_root() { if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
mkdir -p "$CACHE"

# The URI of the host's Debian archive (as scripts/build-libfuse.sh finds it).
debian_mirror() {
    local uri
    uri="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
           | awk 'tolower($1)=="uris:" {for (i = 2; i <= NF; i++) print $i}' \
           | grep -v -- '-security' | grep -E '/debian/?$' | head -n1)" || true
    if [[ -z "$uri" ]]; then
        uri="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
               | awk '$1=="deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; break}}' \
               | grep -v -- '-security' | grep -E '/debian/?$' | head -n1)" || true
    fi
    echo "${uri:-http://deb.debian.org/debian}" | sed 's:/*$::'
}
MIRROR="${HYCACHE_DEBIAN_MIRROR:-$(debian_mirror)}"

# Why Docker cannot run containers with FUSE here (empty when it can).
cannot_run() {
    [[ -e /dev/fuse ]] || { echo "no /dev/fuse on this host"; return; }
    grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null \
        || grep -qw overlay /proc/filesystems || { echo "no overlay file system in this kernel"; return; }
    [[ $EUID -eq 0 ]] || sudo -n true 2>/dev/null || { echo "neither root nor password-less sudo"; return; }
}
why="$(cannot_run)"
[[ -z "$why" ]] || die "Docker cannot run the demo here: $why" 3

# ------------------------------------------------------------------ 1. packages
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=600 \
        --no-install-recommends "${missing[@]}" >&2 \
        || { as_root apt-get update -q >&2 && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
                 -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >&2; }
fi

# ------------------------------------------------------------------ 2. Compose v2
if ! docker compose version >/dev/null 2>&1; then
    deb="$CACHE/docker-compose_${COMPOSE_DEB_VERSION}_amd64.deb"
    if [[ ! -s "$deb" ]]; then
        say "fetching Debian trixie's docker-compose $COMPOSE_DEB_VERSION (private apt configuration)"
        work="$CACHE/apt-trixie"
        mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/dl"
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR trixie main" >"$work/sources.list"
        apt_opts=(-o "Dir::Etc::sourcelist=$work/sources.list" -o "Dir::Etc::sourceparts=-"
                  -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
                  -o "APT::Sandbox::User=root" -o "Dir::State::status=/dev/null")
        apt-get -q "${apt_opts[@]}" update >&2
        (cd "$work/dl" && apt-get -q "${apt_opts[@]}" download "docker-compose=$COMPOSE_DEB_VERSION" >&2)
        mv "$work/dl/"docker-compose_*.deb "$deb"
        rm -rf "$work"
    fi
    x="$CACHE/compose-x" && rm -rf "$x" && dpkg-deb -x "$deb" "$x"
    bin="$(find "$x" -type f -name docker-compose -perm -u+x | head -n1)"
    [[ -n "$bin" ]] || die "no docker-compose binary in $deb"
    as_root install -D -m 0755 "$bin" "$PLUGIN_DIR/docker-compose"
    rm -rf "$x"
    docker compose version >/dev/null || die "docker compose still missing after installing $PLUGIN_DIR/docker-compose"
fi

# ------------------------------------------------------------------ 3. dockerd
if ! docker info >/dev/null 2>&1; then
    say "starting dockerd (log: $CACHE/dockerd.log)"
    as_root setsid nohup nice -n 10 dockerd >>"$CACHE/dockerd.log" 2>&1 </dev/null &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || die "dockerd did not start: $(tail -n 5 "$CACHE/dockerd.log")" 3
fi

# ------------------------------------------------------------------ 4. images
have() { docker image inspect "$1" >/dev/null 2>&1; }
build() { # build TAG DOCKERFILE: again when deploy/local/ changed (label hycache.src)
    local tag=$1 file=$2 key
    key="$(cat "$REPO/deploy/local/"* | sha256sum | cut -c1-16)"
    [[ "$(docker image inspect -f '{{index .Config.Labels "hycache.src"}}' "$tag" 2>/dev/null)" == "$key" ]] && return 0
    say "building $tag ($file)"
    # the classic builder: these Dockerfiles need nothing of BuildKit, and the docker CLI
    # may lack the buildx plugin that BuildKit builds need from the CLI
    DOCKER_BUILDKIT=0 nice docker build -q --label "hycache.src=$key" -t "$tag" -f "$REPO/deploy/local/$file" \
        "$REPO/deploy/local" 2>&1 >/dev/null | grep -v -e '^DEPRECATED' -e 'legacy builder' -e 'BuildKit' -e '^ *environment-variable' -e '^$' >&2 || true
    have "$tag" || die "building $tag failed"
}
debian() { # debian SUITE
    local tag="hycache-local/debian:$1" tar="$CACHE/debian-$1-minbase.tar"
    have "$tag" && return 0
    if [[ ! -s "$tar" ]]; then
        say "debootstrap --variant=minbase $1 ($MIRROR)"
        local root="$CACHE/rootfs-$1"
        as_root rm -rf "$root"
        as_root nice debootstrap --variant=minbase "$1" "$root" "$MIRROR" >"$CACHE/debootstrap-$1.log" 2>&1 \
            || die "debootstrap $1 failed: see $CACHE/debootstrap-$1.log"
        as_root rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
        as_root tar -C "$root" -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
        as_root rm -rf "$root"
    fi
    docker import -c 'CMD ["bash"]' -c 'ENV LANG=C.UTF-8' "$tar" "$tag" >/dev/null
}
debian bookworm
build hycache-local/redis:7 redis.Dockerfile
build hycache-local/postgres:15 postgres.Dockerfile
debian trixie
build hycache-local/node:20 node.Dockerfile
uv_tag="hycache-local/uv:$UV_VERSION"
if ! have "$uv_tag"; then
    whl_dir="$CACHE/uv-$UV_VERSION"
    if [[ ! -x "$whl_dir/uv" ]]; then
        say "uv $UV_VERSION from PyPI's wheel"
        rm -rf "$whl_dir" && mkdir -p "$whl_dir/w"
        python3 -m pip download -q --no-deps --only-binary :all: --platform manylinux_2_17_x86_64 \
            --python-version 3.11 "uv==$UV_VERSION" -d "$whl_dir/w" >&2
        python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); open(sys.argv[2], "wb").write(z.read(next(n for n in z.namelist() if n.endswith("/scripts/uv"))))' \
            "$(ls "$whl_dir"/w/uv-*.whl)" "$whl_dir/uv"
        chmod 755 "$whl_dir/uv" && rm -rf "$whl_dir/w"
    fi
    printf 'FROM scratch\nCOPY uv /uv\n' | DOCKER_BUILDKIT=0 docker build -q -t "$uv_tag" -f - "$whl_dir" >/dev/null 2>&1
    have "$uv_tag" || die "building $uv_tag failed"
fi

# ------------------------------------------------------------------ 5. .env
env_file="$REPO/.env"
if [[ -f "$env_file" ]] && ! grep -q '^# written by deploy/local-images.sh' "$env_file"; then
    die "$env_file exists and was not written by this script: add these lines to it yourself:
$(printf 'HYCACHE_%s\n' BASE_IMAGE=hycache-local/debian:bookworm)" 1
fi
cat >"$env_file.tmp" <<ENV
# written by deploy/local-images.sh: compose reads it (images that this machine built
# instead of pulling them; delete this file to use the official images)
HYCACHE_BASE_IMAGE=hycache-local/debian:bookworm
HYCACHE_UV_IMAGE=$uv_tag
HYCACHE_NODE_IMAGE=hycache-local/node:20
HYCACHE_REDIS_IMAGE=hycache-local/redis:7
HYCACHE_POSTGRES_IMAGE=hycache-local/postgres:15
HYCACHE_CA_BUNDLE=$CA_BUNDLE
ENV
mv "$env_file.tmp" "$env_file"
say "ok: $(docker compose version --short 2>/dev/null || true) on Docker $(docker version -f '{{.Server.Version}}'); images: $(docker images --format '{{.Repository}}:{{.Tag}}' 'hycache-local/*' | sort | tr '\n' ' ')"
