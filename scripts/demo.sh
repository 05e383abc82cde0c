#!/usr/bin/env bash
# THE product command: install what is missing, then
#   1. the narrated tour (`hycache-agent demo`): one tiering mount whose files move between
#      tiers, then a two-node global namespace on a local Redis Cluster (takeover, replica,
#      kill -9 of a node);
#   2. the whole product (`hycache-control demo`): a local Redis Cluster, the control plane
#      on SQLite, two agents with FUSE mounts linked to it and a light workload; prints the
#      dashboard URL, the tokens and a curl example, and runs until Ctrl-C.
#
#   bash scripts/demo.sh                      # both parts
#   bash scripts/demo.sh --skip-tour          # only the running product
#   bash scripts/demo.sh --duration 60        # stop by itself after 60 s (scripts, CI)
#   bash scripts/demo.sh --agents 3 --fast-capacity 32M
# Options other than --skip-tour go to `hycache-control demo` (see its --help).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bootstrapped
tour=1
args=()
for a in "$@"; do
    if [[ "$a" == "--skip-tour" ]]; then tour=0; else args+=("$a"); fi
done
if ((tour)); then
    "$UV" run --frozen --all-packages hycache-agent demo
fi
exec "$UV" run --frozen --all-packages hycache-control demo "${args[@]}"
