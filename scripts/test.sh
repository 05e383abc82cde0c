#!/usr/bin/env bash
# THE test command: install what is missing, then run the whole test suite.
#
#   bash scripts/test.sh                     # everything under tests/
#   bash scripts/test.sh tests/posix -x -v   # extra arguments go to pytest
#   bash scripts/test.sh -m "not mount"      # skip real FUSE mounts
#
# Exit status is pytest's (non-zero on any failure or error).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bootstrapped
start=$SECONDS
rc=0
"$UV" run --frozen --all-packages pytest "$@" || rc=$?
echo "test.sh: pytest exit status $rc after $((SECONDS - start)) s" >&2
exit "$rc"
