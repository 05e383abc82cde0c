#!/bin/sh
# One shot (compose service control-plane-tokens): a node token for each agent named on
# the command line, in TOKEN_DIR/<node id> (mode 0600), made once; the agents read theirs
# with --control-token-file. Existing files are kept (the control plane stores only the
# tokens' hashes: a lost file needs a new token).
set -eu
dir=${TOKEN_DIR:-/tokens}
umask 077
mkdir -p "$dir"
for node in "$@"; do
    out=$dir/$node
    if [ -s "$out" ]; then
        echo "node-tokens: $out exists; keeping it"
        continue
    fi
    /usr/local/bin/hycache-control-entrypoint token create --scope node --node-id "$node" --name "$node" > "$out.tmp"
    chmod 600 "$out.tmp"
    mv "$out.tmp" "$out"
    echo "node-tokens: made the token of node $node"
done
