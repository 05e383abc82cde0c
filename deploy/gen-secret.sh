#!/bin/sh
# Create the compose demo's secrets: 32 random bytes, base64, mode 0600 each.
#   sh deploy/gen-secret.sh            cluster-secret, db-password, admin-token and the
#                                      Redis ACL passwords (redis-*-password)
#                                      in deploy/secrets/ (each one that is missing)
#   sh deploy/gen-secret.sh FILE       only FILE
# Leaves an existing file alone (all agents must share one secret; the database keeps
# the password it was created with).
set -eu
umask 077

gen() {
    out=$1
    if [ -s "$out" ]; then
        echo "gen-secret: $out exists; keeping it" >&2
        return 0
    fi
    mkdir -p "$(dirname "$out")"
    head -c 32 /dev/urandom | base64 > "$out.tmp"
    chmod 600 "$out.tmp"
    mv "$out.tmp" "$out"
    echo "gen-secret: wrote $out"
}

if [ $# -ge 1 ]; then
    gen "$1"
else
    dir=$(dirname "$0")/secrets
    gen "$dir/cluster-secret"   # the agents' shared secret
    gen "$dir/db-password"      # the control plane's PostgreSQL password
    gen "$dir/admin-token"      # the control plane's first admin token (API, dashboard)
    gen "$dir/redis-admin-password"    # Redis ACL: hycache-admin (replication, cluster-init)
    gen "$dir/redis-agent-password"    # Redis ACL: hycache-agent
    gen "$dir/redis-control-password"  # Redis ACL: hycache-control
fi
