#!/usr/bin/env bash
# Install everything HyCache needs to build, run and test, idempotently.
#
#   bash scripts/bootstrap.sh        # quiet; ~2 s when everything is present
#   VERBOSE=1 bash scripts/bootstrap.sh
#
# What it does (each step is skipped when already satisfied):
#   1. apt packages (apt-get update only runs when something is missing)
#   2. /etc/fuse.conf: user_allow_other (the agent mounts with allow_other)
#   3. uv (pinned, pip install uv==$UV_VERSION when `uv` is missing or another version)
#   4. uv sync --frozen --all-packages (workspace packages + the dev group) into .venv,
#      then byte-compiled (compileall: the installed packages and the workspace's sources)
#      pyfuse3 is a source distribution: the first sync compiles it (needs libfuse3-dev,
#      pkg-config, a C compiler); uv keeps the built wheel in its cache (~/.cache/uv,
#      or $UV_CACHE_DIR), so later syncs and fresh clones reuse it without compiling.
#      pyfuse3 itself comes from .work/pyfuse3 (see pyproject.toml's [tool.uv.sources]):
#      scripts/build-libfuse.sh builds libfuse 3.17 from Debian trixie's source package
#      into $HYCACHE_TOOLS_DIR/libfuse-$LIBFUSE_VERSION and pyfuse3 with
#      agent/patches/pyfuse3-passthrough.patch against it (FUSE passthrough).
#   5. pjdfstest (crates.io, pinned) via `cargo install --locked` into
#      $HYCACHE_TOOLS_DIR/pjdfstest-$PJDFSTEST_VERSION (default ~/.cache/hycache), outside
#      the clone so that clean clones (CI) reuse it; linked as .work/bin/pjdfstest.
#   6. the dashboard (frontend/): `npm ci` from package-lock.json when node_modules is
#      missing or older than the lock file, then `vite build` into frontend/dist when dist
#      is missing or older than any source; the control plane serves frontend/dist at /.
#      Nothing built is committed. Needs Node.js >= 20.19 (skipped with a warning without).
#      Chromium (apt) is for the dashboard's browser tests (Playwright drives it).
#   7. fsx (crates.io, pinned) with tests/posix/patches/fsx-odirect.patch (O_DIRECT mode):
#      scripts/build-fsx.sh, `cargo install --locked --path` of the patched crate into
#      $HYCACHE_TOOLS_DIR/fsx-$FSX_VERSION-odirect-<patch hash>; linked as .work/bin/fsx.
#
# Works without a tty (CI=true, no stdin). Needs root (or sudo) only for steps 1-2.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.env
source "$REPO/scripts/versions.env"
VERBOSE="${VERBOSE:-0}"
TOOLS_DIR="${HYCACHE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hycache}"
mkdir -p "$TOOLS_DIR" "$REPO/.work/bin"

say() { echo "bootstrap: $*" >&2; }
die() { echo "bootstrap: ERROR: $*" >&2; exit 1; }
# Run quietly unless VERBOSE=1; show the output if the command fails.
quiet() {
    if [[ "$VERBOSE" == 1 ]]; then "$@"; return; fi
    local log rc=0
    log="$(mktemp)"
    "$@" >"$log" 2>&1 || rc=$?
    if [[ $rc -ne 0 ]]; then cat "$log" >&2; rm -f "$log"; say "failed ($rc): $*"; return $rc; fi
    rm -f "$log"
}
as_root() {
    if [[ $EUID -eq 0 ]]; then "$@"
    elif command -v sudo >/dev/null; then sudo -n "$@"
    else die "need root for: $*"; fi
}

# Serialise concurrent bootstraps (several engineers / CI jobs on one machine):
# apt and cargo do not like running twice at once.
exec 9>"$TOOLS_DIR/bootstrap.lock"
flock 9

# ---------------------------------------------------------------- 1. apt packages
APT_PACKAGES=(
    fuse3 libfuse3-dev pkg-config     # FUSE runtime, headers for building pyfuse3
    liburing-dev                      # FUSE over io_uring in the patched pyfuse3 (hycache_uring.h)
    dpkg-dev meson ninja-build patch  # apt-get source + build of libfuse 3.17 (passthrough)
    build-essential python3-dev       # C toolchain for source builds
    redis-server                      # the DHT (tests start real Redis Cluster processes)
    postgresql postgresql-client      # the control plane's production database (tests/control start one)
    haproxy                           # the load balancer in front of several control-plane processes (tests/control)
    fio mergerfs attr acl             # benchmark, peer FUSE fs for comparisons, xattr/ACL tools
    ca-certificates git procps psmisc util-linux
    chromium                          # the dashboard's browser tests (Playwright, executablePath)
    slurmctld slurmd slurm-client munge curl  # Slurm 22.05 (burst_buffer_lua.so, job_submit_lua.so; liblua5.1) for tests/slurm
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    say "installing apt packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    quiet as_root apt-get update -q
    quiet as_root apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# ---------------------------------------------------------------- 2. fuse.conf
# allow_other is needed so that other users (pjdfstest's dummy users, apps running as
# other users) can use a mount; non-root mounters need user_allow_other for that.
if ! grep -qE '^[[:space:]]*user_allow_other[[:space:]]*$' /etc/fuse.conf 2>/dev/null; then
    say "enabling user_allow_other in /etc/fuse.conf"
    echo "user_allow_other" | as_root tee -a /etc/fuse.conf >/dev/null
fi
[[ -c /dev/fuse ]] || say "WARNING: /dev/fuse is missing: mount tests will be skipped"

# Dummy users for pjdfstest (present on every Debian base system; check anyway).
for ug in nobody:nogroup daemon:daemon; do
    getent passwd "${ug%%:*}" >/dev/null && getent group "${ug##*:}" >/dev/null \
        || say "WARNING: user/group ${ug} missing: pjdfstest needs it"
done

# ---------------------------------------------------------------- 3. uv
find_uv() {
    local u
    for u in "$(command -v uv 2>/dev/null || true)" "$HOME/.local/bin/uv" "$(python3 -c 'import sysconfig;print(sysconfig.get_path("scripts"))' 2>/dev/null)/uv"; do
        if [[ -n "$u" && -x "$u" ]] && [[ "$("$u" --version 2>/dev/null)" == "uv $UV_VERSION"* ]]; then
            echo "$u"; return 0
        fi
    done
    return 1
}
if ! UV="$(find_uv)"; then
    say "installing uv==$UV_VERSION with pip"
    command -v python3 >/dev/null || die "python3 not found (expected Python 3.11 from pyenv)"
    quiet python3 -m pip install -q "uv==$UV_VERSION" \
        || quiet python3 -m pip install -q --user --break-system-packages "uv==$UV_VERSION"
    command -v pyenv >/dev/null && pyenv rehash >/dev/null 2>&1 || true
    UV="$(find_uv)" || die "uv $UV_VERSION installed but not found on PATH"
fi
echo "$UV" >"$REPO/.work/uv-path"   # scripts/lib.sh reads this (test.sh, demo.sh)

# ---------------------------------------------------------------- 4. Python env
cd "$REPO"
# libfuse 3.17 (FUSE passthrough) in a private prefix and pyfuse3 patched for it: built
# once into $TOOLS_DIR (about 2 min), then copied to the path uv.lock names.
if [[ ! -f "$TOOLS_DIR/libfuse-$LIBFUSE_VERSION/.done-$LIBFUSE_DEB_VERSION" ]]; then
    say "building libfuse $LIBFUSE_VERSION (one time, ~1 min; pyfuse3 is then built by uv sync)"
fi
BUILD_LOG="$(mktemp)"
PYFUSE3_SRC="$(bash "$REPO/scripts/build-libfuse.sh" "$TOOLS_DIR" "$UV" 2>"$BUILD_LOG")" \
    || { cat "$BUILD_LOG" >&2; die "building libfuse/preparing pyfuse3 failed"; }
rm -f "$BUILD_LOG"
# the source tree uv.lock names (a copy: uv keys its build cache on the tree's files)
if ! diff -rq "$PYFUSE3_SRC" "$REPO/.work/pyfuse3" >/dev/null 2>&1; then
    rm -rf "$REPO/.work/pyfuse3" && cp -a "$PYFUSE3_SRC" "$REPO/.work/pyfuse3"
fi
# No network access for interpreters: use the machine's Python (pyenv 3.11).
export UV_PYTHON_DOWNLOADS="${UV_PYTHON_DOWNLOADS:-never}"
quiet "$UV" sync --frozen --all-packages
# Bytecode, compiled once: where PYTHONDONTWRITEBYTECODE is set (as on this project's test
# machine) no process writes .pyc files, and every agent, CLI and test process compiled each
# module it imported from source (the agent's imports took 2.7 s of CPU, 0.85 s from
# bytecode; `hycache-control --help` 2.2 s, 0.8 s). ~45 s the first time, then ~1 s (only what changed).
"$REPO/.venv/bin/python" -m compileall -q \
    "$("$REPO/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    "$REPO/core/src" "$REPO/agent/src" "$REPO/dht/src" "$REPO/backend/src" "$REPO/harness/src" \
    >/dev/null 2>&1 || true  # (some packages ship files that are not Python 3: skipped)

# ---------------------------------------------------------------- 5. pjdfstest
PJD_ROOT="$TOOLS_DIR/pjdfstest-$PJDFSTEST_VERSION"
PJD_BIN="$PJD_ROOT/bin/pjdfstest"
if [[ ! -x "$PJD_BIN" ]] || [[ "$("$PJD_BIN" --version 2>/dev/null)" != "pjdfstest $PJDFSTEST_VERSION" ]]; then
    command -v cargo >/dev/null || [[ -x "$HOME/.cargo/bin/cargo" ]] \
        || die "cargo not found: install Rust >= 1.85 (pjdfstest $PJDFSTEST_VERSION needs it)"
    CARGO="$(command -v cargo || echo "$HOME/.cargo/bin/cargo")"
    say "building pjdfstest $PJDFSTEST_VERSION from crates.io (one time, ~1-3 min)"
    quiet nice "$CARGO" install --locked --quiet --force --version "$PJDFSTEST_VERSION" \
        --root "$PJD_ROOT" pjdfstest
fi
ln -sfn "$PJD_BIN" "$REPO/.work/bin/pjdfstest"

# ---------------------------------------------------------------- 6. dashboard
FRONTEND="$REPO/frontend"
node_ok() {
    command -v node >/dev/null && command -v npm >/dev/null \
        && node -e 'const [a,b]=process.versions.node.split(".").map(Number);process.exit(a>20||(a==20&&b>=19)?0:1)'
}
if [[ -f "$FRONTEND/package-lock.json" ]]; then
    if ! node_ok; then
        say "WARNING: Node.js >= 20.19 with npm not found: the dashboard (frontend/dist) is not built"
    else
        if [[ ! -f "$FRONTEND/node_modules/.package-lock.json" \
              || "$FRONTEND/package-lock.json" -nt "$FRONTEND/node_modules/.package-lock.json" ]]; then
            say "installing the dashboard's npm packages (npm ci)"
            (cd "$FRONTEND" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 quiet npm ci --no-audit --no-fund)
        fi
        stamp="$FRONTEND/dist/index.html"
        if [[ ! -f "$stamp" ]] || [[ -n "$(find "$FRONTEND/src" "$FRONTEND/index.html" "$FRONTEND/vite.config.ts" \
                "$FRONTEND/package-lock.json" -newer "$stamp" -print -quit 2>/dev/null)" ]]; then
            say "building the dashboard (vite build -> frontend/dist)"
            (cd "$FRONTEND" && quiet npx --no-install vite build)
        fi
    fi
fi

# ---------------------------------------------------------------- 7. fsx
# The File System eXerciser (Rust rewrite, crates.io): not packaged in Debian. Built with
# tests/posix/patches/fsx-odirect.patch (an O_DIRECT mode) by scripts/build-fsx.sh into
# $TOOLS_DIR/fsx-$FSX_VERSION-odirect-<patch hash> (one time, ~1-3 min), linked as .work/bin/fsx.
say "fsx $FSX_VERSION with the O_DIRECT patch (cached; a build takes ~1-3 min once)"
BUILD_LOG="$(mktemp)"
FSX_BIN="$(bash "$REPO/scripts/build-fsx.sh" "$TOOLS_DIR" 2>"$BUILD_LOG")" \
    || { cat "$BUILD_LOG" >&2; die "building fsx failed"; }
rm -f "$BUILD_LOG"
ln -sfn "$FSX_BIN" "$REPO/.work/bin/fsx"

say "ok (uv $UV_VERSION, pjdfstest $PJDFSTEST_VERSION, fsx $FSX_VERSION+odirect, libfuse $LIBFUSE_VERSION, .venv synced)"
