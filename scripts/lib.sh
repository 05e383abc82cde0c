# Sourced by the entry scripts (demo.sh, test.sh), after their `set -euo pipefail`:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   bootstrapped        # cd to the repository, install what is missing, set UV
#   "$UV" run --frozen --all-packages ...
#
# shellcheck shell=bash

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Go to the repository, run bootstrap.sh (idempotent) and set UV to the uv it installed;
# no Python downloads unless UV_PYTHON_DOWNLOADS says otherwise.
bootstrapped() {
    cd "$REPO"
    bash scripts/bootstrap.sh
    UV="$(cat .work/uv-path)"
    export UV_PYTHON_DOWNLOADS="${UV_PYTHON_DOWNLOADS:-never}"
}
