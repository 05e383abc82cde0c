#!/bin/sh
# Create the compose demo's cluster secret: 32 random bytes, base64, mode 0600.
#   sh deploy/gen-secret.sh [FILE]     (default deploy/secrets/cluster-secret)
# Leaves an existing file alone (all agents must share one secret).
set -eu
out=${1:-$(dirname "$0")/secrets/cluster-secret}
if [ -s "$out" ]; then
    echo "gen-secret: $out exists; keeping it" >&2
    exit 0
fi
umask 077
mkdir -p "$(dirname "$out")"
head -c 32 /dev/urandom | base64 > "$out.tmp"
chmod 600 "$out.tmp"
mv "$out.tmp" "$out"
echo "gen-secret: wrote $out"
