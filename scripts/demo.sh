#!/usr/bin/env bash
# THE product command: install what is missing, then run the HyCache demo
# (mounts a demo tiering file system over a temp root and runs a small workload).
#
#   bash scripts/demo.sh [extra args for `hycache-agent demo`]
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bootstrapped
exec "$UV" run --frozen --all-packages hycache-agent demo "$@"
