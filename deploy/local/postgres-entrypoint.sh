#!/bin/sh
# Entry point of hycache-local/postgres (deploy/local/postgres.Dockerfile): the subset of
# the official postgres image's that docker-compose.yml relies on. Runs as root: reads
# the password (a root-only compose secret), initialises an empty PGDATA once, then runs
# the server as the postgres user.
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
    password=$(cat "$POSTGRES_PASSWORD_FILE")
else
    password=${POSTGRES_PASSWORD:-}
fi
[ -n "$password" ] || { echo "postgres-entrypoint: set POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE" >&2; exit 1; }
as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp) && chown postgres "$pwfile"
    printf '%s\n' "$password" > "$pwfile"
    as_pg initdb -D "$PGDATA" --username="$user" --pwfile="$pwfile" --auth-local=trust \
        --auth-host=scram-sha-256 --encoding=UTF8 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    if [ "$db" != postgres ]; then
        echo "CREATE DATABASE \"$db\" OWNER \"$user\";" | as_pg postgres --single -D "$PGDATA" -j postgres >/dev/null
    fi
    echo "postgres-entrypoint: initialised $PGDATA (user $user, database $db)"
fi
[ "$1" = postgres ] && exec setpriv --reuid=postgres --regid=postgres --init-groups "$@"
exec "$@"
