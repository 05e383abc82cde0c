#!/usr/bin/env bash
# The code's shape, checked: ruff (style and bugs), import-linter (the layer contracts in
# pyproject.toml's [tool.importlinter]) and mypy (strict on core/ and dht/; see [tool.mypy]).
# scripts/test.sh runs it before the tests; alone:
#
#   bash scripts/lint.sh
#
# Exit status: 0 when all three pass, else 1 (each tool still runs and prints).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bootstrapped
rc=0
step() {
    local name="$1"; shift
    local start=$SECONDS
    if "$@"; then
        echo "lint: $name passed ($((SECONDS - start)) s)" >&2
    else
        echo "lint: $name FAILED" >&2
        rc=1
    fi
}
step ruff "$UV" run --frozen --all-packages ruff check .
step import-linter "$UV" run --frozen --all-packages lint-imports
step mypy "$UV" run --frozen --all-packages mypy
exit "$rc"
