#!/usr/bin/env bash
# Build libfuse $LIBFUSE_VERSION (FUSE passthrough) and prepare pyfuse3 $PYFUSE3_VERSION
# patched for passthrough against it; print the path of the patched source tree.
#
#   bash scripts/build-libfuse.sh TOOLS_DIR UV
#
# libfuse: Debian 13 (trixie) `fuse3` source package, fetched with `apt-get source` under a
# PRIVATE apt configuration (its own sources list, lists and cache directories under
# TOOLS_DIR): the host's apt sources are never changed and no trixie binary package is
# ever installed (they need glibc 2.38). Built with meson into
# TOOLS_DIR/libfuse-$LIBFUSE_VERSION (soname libfuse3.so.4: the system's libfuse3.so.3 is
# untouched).
# pyfuse3: the sdist from PyPI with agent/patches/pyfuse3-passthrough.patch applied, as a
# source tree (printed on stdout); uv builds it against that prefix with an rpath to it
# (the extension finds the private libfuse at run time without LD_LIBRARY_PATH), version
# $PYFUSE3_WHEEL_VERSION (a local version label, so `pyfuse3==3.5.0` still matches). Both
# are cached in TOOLS_DIR, keyed by version and by the patch's hash. Called by
# scripts/bootstrap.sh.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.env
source "$REPO/scripts/versions.env"
TOOLS_DIR="$1"
UV="$2"
PATCH="$REPO/agent/patches/pyfuse3-passthrough.patch"
exec 3>&1 1>&2   # build chatter to stderr; only the source tree's path goes to stdout

# The URI of the host's Debian archive, from its apt sources (deb822 .sources files or
# one-line sources.list entries), skipping the security archive.
debian_mirror() {
    local uri
    uri="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
           | awk 'tolower($1)=="uris:" {for (i = 2; i <= NF; i++) print $i}' \
           | grep -v -- '-security' | grep -E '/debian/?$' | head -n1)"
    if [[ -z "$uri" ]]; then
        uri="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
               | awk '$1=="deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; break}}' \
               | grep -v -- '-security' | grep -E '/debian/?$' | head -n1)"
    fi
    [[ -n "$uri" ]] && echo "${uri%/}"
}

PREFIX="$TOOLS_DIR/libfuse-$LIBFUSE_VERSION"
if [[ ! -f "$PREFIX/.done-$LIBFUSE_DEB_VERSION" ]]; then
    work="$TOOLS_DIR/libfuse-build"
    rm -rf "$work" "$PREFIX"
    mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/src"
    # the Debian mirror this machine's apt already uses (its main archive, not security),
    # asked for trixie's source packages only
    mirror="$(debian_mirror)" || { echo "no Debian mirror found in the host's apt sources" >&2; exit 1; }
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" \
        >"$work/apt/sources.list"
    APT_OPTS=(-o "Dir::Etc::sourcelist=$work/apt/sources.list" -o "Dir::Etc::sourceparts=-"
              -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache"
              -o "APT::Sandbox::User=root")
    apt-get -q "${APT_OPTS[@]}" update
    (cd "$work/src" && apt-get -q "${APT_OPTS[@]}" source --only-source "fuse3=$LIBFUSE_DEB_VERSION")
    src="$work/src/fuse3-$LIBFUSE_VERSION"
    meson setup "$src/build" "$src" --prefix="$PREFIX" --libdir=lib --buildtype=release \
        -Dexamples=false -Dutils=false -Dtests=false -Ddisable-mtab=true -Duseroot=false \
        -Dudevrulesdir="$PREFIX/udev" -Dinitscriptdir=
    ninja -C "$src/build"
    ninja -C "$src/build" install
    touch "$PREFIX/.done-$LIBFUSE_DEB_VERSION"
    rm -rf "$work"
fi

# pyfuse3: the PyPI sdist with the patch applied, as a source tree that uv builds itself
# (a directory source in pyproject.toml: uv.lock records no hash of a locally built wheel,
# which could not be reproduced on another machine). Its build backend reads
# hycache-libfuse-prefix to compile against the private libfuse with an rpath to it.
key="$(cat "$PATCH" | sha256sum | cut -c1-12)"
OUT="$TOOLS_DIR/pyfuse3-$PYFUSE3_VERSION-src-$key"
if [[ ! -f "$OUT/hycache-libfuse-prefix" ]]; then
    work="$TOOLS_DIR/pyfuse3-build"
    rm -rf "$work" "$OUT" && mkdir -p "$work"
    # the sdist of pyfuse3 only (--no-binary pyfuse3): pip prepares its metadata in a build
    # environment whose setuptools and Cython may be wheels (with :all:, pip compiled Cython
    # from source first: ~10 min on a small host, tests/deploy/test_ansible_rollout.py)
    (cd "$work" && python3 -m pip download -q --no-deps --no-binary pyfuse3 "pyfuse3==$PYFUSE3_VERSION" -d .)
    tar xzf "$work/pyfuse3-$PYFUSE3_VERSION.tar.gz" -C "$work"
    src="$work/pyfuse3-$PYFUSE3_VERSION"
    patch -d "$src" -p1 --quiet <"$PATCH"
    rm -f "$src/src/pyfuse3/__init__.c"   # generated from the patched .pyx by Cython
    echo "$PREFIX" >"$src/hycache-libfuse-prefix"
    mv "$src" "$OUT"
    rm -rf "$work"
fi
echo "$OUT" >&3
