#!/bin/sh
# Entry point of the HyCache control-plane image: takes `hycache-control` arguments.
#
# Unless HYCACHE_CONTROL_DB is set, it builds the PostgreSQL URL from the password in
# HYCACHE_DB_PASSWORD_FILE (a compose secret) and HYCACHE_DB_USER/HOST/PORT/NAME, so the
# password never appears in the compose file or in `docker inspect`.
set -eu

if [ -z "${HYCACHE_CONTROL_DB:-}" ] && [ -n "${HYCACHE_DB_PASSWORD_FILE:-}" ]; then
    password=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(open(sys.argv[1]).read().strip(), safe=""))' \
        "$HYCACHE_DB_PASSWORD_FILE")
    HYCACHE_CONTROL_DB="postgresql+psycopg://${HYCACHE_DB_USER:-hycache}:${password}@${HYCACHE_DB_HOST:-postgres}:${HYCACHE_DB_PORT:-5432}/${HYCACHE_DB_NAME:-hycache}"
    export HYCACHE_CONTROL_DB
fi
exec hycache-control "$@"
