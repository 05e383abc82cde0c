#!/usr/bin/env bash
# THE product command: install what is missing, then run the HyCache demo
# (mounts a demo tiering file system over a temp root and runs a small workload).
#
#   bash scripts/demo.sh [extra args for `hycache-agent demo`]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash scripts/bootstrap.sh
UV="$(cat .work/uv-path)"
export UV_PYTHON_DOWNLOADS="${UV_PYTHON_DOWNLOADS:-never}"
exec "$UV" run --frozen --all-packages hycache-agent demo "$@"
