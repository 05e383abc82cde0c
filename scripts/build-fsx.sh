#!/usr/bin/env bash
# Build fsx $FSX_VERSION (crates.io) with tests/posix/patches/fsx-odirect.patch (an O_DIRECT
# mode, which the crate lacks); print the path of the installed binary.
#
#   bash scripts/build-fsx.sh TOOLS_DIR
#
# The .crate file comes from cargo's own download cache ($CARGO_HOME/registry/cache) when
# an earlier `cargo install`/`cargo fetch` left it there, else from the registry's download
# URL, found as cargo finds it (the `dl` template in the sparse index's config.json); either
# way its SHA-256 must be FSX_CRATE_SHA256 (the checksum crates.io's index lists for it).
# Unpacked, patched, then `cargo install --locked --path` (the crate's own Cargo.lock, as
# `cargo install --locked fsx` would use) into TOOLS_DIR/fsx-$FSX_VERSION-odirect-<patch
# hash>: cached outside the clone, keyed by version and by the patch's hash. Called by
# scripts/bootstrap.sh (step 7).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.env
source "$REPO/scripts/versions.env"
TOOLS_DIR="$1"
PATCH="$REPO/tests/posix/patches/fsx-odirect.patch"
CRATES_IO_INDEX="${HYCACHE_CRATES_IO_INDEX:-https://index.crates.io}"   # cargo's default
exec 3>&1 1>&2   # build chatter to stderr; only the binary's path goes to stdout

key="$(sha256sum <"$PATCH" | cut -c1-12)"
OUT="$TOOLS_DIR/fsx-$FSX_VERSION-odirect-$key"
if [[ -x "$OUT/bin/fsx" && -f "$OUT/.done" ]]; then
    echo "$OUT/bin/fsx" >&3
    exit 0
fi
CARGO="$(command -v cargo || echo "$HOME/.cargo/bin/cargo")"
[[ -x "$CARGO" ]] || { echo "cargo not found: install Rust >= 1.82 (fsx $FSX_VERSION needs it)"; exit 1; }

work="$TOOLS_DIR/fsx-build"
rm -rf "$work" "$OUT" && mkdir -p "$work"
crate="$work/fsx-$FSX_VERSION.crate"
sha_ok() { [[ "$(sha256sum <"$1" | cut -d' ' -f1)" == "$FSX_CRATE_SHA256" ]]; }

for cached in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"fsx-$FSX_VERSION.crate"; do
    if [[ -f "$cached" ]] && sha_ok "$cached"; then cp "$cached" "$crate"; break; fi
done
if [[ ! -f "$crate" ]]; then
    # cargo's rule: `dl` with {crate}/{version}/... markers is a template, else
    # "$dl/{crate}/{version}/download"
    dl="$(curl -fsSL --retry 3 "$CRATES_IO_INDEX/config.json" \
          | python3 -c 'import json,sys; print(json.load(sys.stdin)["dl"])')"
    if [[ "$dl" == *"{"* ]]; then
        url="${dl//\{crate\}/fsx}"
        url="${url//\{version\}/$FSX_VERSION}"
        url="${url//\{prefix\}/3\/f}"
        url="${url//\{lowerprefix\}/3\/f}"
        url="${url//\{sha256-checksum\}/$FSX_CRATE_SHA256}"
    else
        url="$dl/fsx/$FSX_VERSION/download"
    fi
    echo "downloading $url"
    curl -fsSL --retry 3 -o "$crate" "$url"
    sha_ok "$crate" || { echo "fsx-$FSX_VERSION.crate from $url: SHA-256 is not FSX_CRATE_SHA256"; exit 1; }
fi

tar xzf "$crate" -C "$work"
src="$work/fsx-$FSX_VERSION"
patch -d "$src" -p1 --quiet <"$PATCH"
nice "$CARGO" install --locked --quiet --force --path "$src" --root "$OUT"
"$OUT/bin/fsx" --help | grep -q -- "--direct" || { echo "patched fsx has no --direct flag"; exit 1; }
touch "$OUT/.done"
rm -rf "$work"
echo "$OUT/bin/fsx" >&3
