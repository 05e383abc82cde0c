#!/bin/sh
# Form the Redis Cluster from the nodes given as HOST:PORT arguments (3 masters and 3
# replicas for six nodes), once. Idempotent: when the nodes already form a cluster (the
# volumes survived a `docker compose down`), it only waits for cluster_state:ok.
#
#   sh cluster-init.sh redis-1:6379 redis-2:6379 ... redis-6:6379
#
# Environment: REPLICAS (replicas per master, default 1), TIMEOUT (seconds, default 120);
# REDIS_USER and REDIS_PASSWORD_FILE: the ACL user (with cluster rights) to act as.
set -eu
REPLICAS=${REPLICAS:-1}
TIMEOUT=${TIMEOUT:-120}
AUTH=""
if [ -n "${REDIS_PASSWORD_FILE:-}" ]; then
    REDISCLI_AUTH=$(tr -d '\r\n' < "$REDIS_PASSWORD_FILE")   # redis-cli reads it (not in ps)
    export REDISCLI_AUTH
fi
[ -z "${REDIS_USER:-}" ] || AUTH="--user $REDIS_USER"
[ $# -ge 3 ] || { echo "cluster-init: need at least 3 HOST:PORT nodes" >&2; exit 2; }
deadline=$(( $(date +%s) + TIMEOUT ))

cli() { # cli HOST:PORT ARGS...
    node=$1; shift
    # shellcheck disable=SC2086 # AUTH: none or two words
    redis-cli $AUTH --no-auth-warning -h "${node%:*}" -p "${node##*:}" "$@"
}
field() { # field HOST:PORT NAME  -> value of NAME in CLUSTER INFO
    cli "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"
}
wait_until() { # wait_until DESCRIPTION COMMAND...
    what=$1; shift
    until "$@"; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "cluster-init: timed out waiting for $what" >&2
            exit 1
        fi
        sleep 0.5
    done
}
pong() { [ "$(cli "$1" ping 2>/dev/null)" = PONG ]; }
total=$#
masters=$(( total / (REPLICAS + 1) ))
# every node says cluster_state:ok and sees the whole topology: $masters masters holding
# slots and the other nodes as their replicas (gossip spreads the roles after a create)
all_ok() {
    for n in "$@"; do
        [ "$(field "$n" cluster_state)" = ok ] || return 1
        cli "$n" cluster nodes 2>/dev/null | tr -d '\r' | awk -v m="$masters" -v s=$(( total - masters )) '
            $3 ~ /master/ && $3 !~ /fail|handshake/ && NF >= 9 { nm++ }
            $3 ~ /slave/ && $3 !~ /fail|handshake/ && $4 != "-" { ns++ }
            END { exit !(nm == m && ns == s) }' || return 1
    done
}

for n in "$@"; do wait_until "$n to answer" pong "$n"; done

# A node that knows other nodes has been part of a cluster: never create again.
formed=0
for n in "$@"; do
    [ "$(field "$n" cluster_known_nodes)" = 1 ] || formed=1
done

if [ "$formed" = 0 ]; then
    # CLUSTER MEET wants IP addresses: resolve names (compose services), keep addresses
    # as they are (ansible passes IPs, which need no reverse DNS entry)
    addrs=""
    for n in "$@"; do
        host=${n%:*}
        case $host in
            *:*) ip=$host ;;                                                   # IPv6 address
            *[!0-9.]*) ip=$(getent ahostsv4 "$host" | awk '{ print $1; exit }') ;;  # a name
            *) ip=$host ;;                                                     # IPv4 address
        esac
        [ -n "$ip" ] || { echo "cluster-init: cannot resolve $host" >&2; exit 1; }
        addrs="$addrs $ip:${n##*:}"
    done
    echo "cluster-init: creating the cluster:$addrs (replicas $REPLICAS)"
    # shellcheck disable=SC2086 # one word per node
    redis-cli $AUTH --no-auth-warning --cluster create $addrs --cluster-replicas "$REPLICAS" --cluster-yes
else
    echo "cluster-init: the nodes already form a cluster; not creating it again"
fi

wait_until "cluster_state:ok and $masters masters + $(( total - masters )) replicas on every node" all_ok "$@"
echo "cluster-init: cluster_state:ok on all $total nodes ($masters masters, $(( total - masters )) replicas)"
