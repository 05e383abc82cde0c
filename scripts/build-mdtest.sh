#!/usr/bin/env bash
# Build mdtest (the IOR project's metadata benchmark, github.com/hpc/ior) with Debian's
# OpenMPI into .work/bin/mdtest, where bench/fs_bench.py finds it (its `mdtest` rows).
#
#   bash scripts/build-mdtest.sh IOR_SOURCE_DIR
#
# IOR_SOURCE_DIR: a checkout or release tarball of hpc/ior (not fetched here: this machine
# reaches only package registries). Installs openmpi-bin, libopenmpi-dev, autoconf and
# automake with apt when missing. Nothing is built into the repository itself.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
SRC="${1:?usage: build-mdtest.sh IOR_SOURCE_DIR (a checkout of github.com/hpc/ior)}"
[[ -f "$SRC/configure.ac" && -d "$SRC/src" ]] || { echo "build-mdtest: $SRC is not an IOR source tree" >&2; exit 2; }
if ! command -v mpicc >/dev/null || ! command -v autoreconf >/dev/null; then
    apt-get install -y --no-install-recommends openmpi-bin libopenmpi-dev autoconf automake pkg-config
fi
work="$REPO/.work/mdtest-build"
rm -rf "$work" && mkdir -p "$work" && cp -a "$SRC/." "$work/"
cd "$work"
[[ -x configure ]] || nice ./bootstrap
nice ./configure --prefix="$work/inst" >/dev/null
nice make -j"$(nproc)" >/dev/null
make install >/dev/null
mkdir -p "$REPO/.work/bin"
cp "$work/inst/bin/mdtest" "$REPO/.work/bin/mdtest"
echo "$REPO/.work/bin/mdtest"
