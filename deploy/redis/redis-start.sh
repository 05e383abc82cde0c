#!/bin/sh
# Start one Redis node of the compose demo with its access control (docker-compose.yml
# runs this instead of redis-server): the ACL users and the replication credentials are
# made from the password secrets in $SECRETS (default /run/secrets) into a 0600 file that
# redis.conf's settings are extended with (`--include`), so no password appears in the
# compose file, in `docker inspect` or in the process list.
#
#   default          off: a client without credentials can do nothing (NOAUTH)
#   hycache-admin    everything: cluster creation (cluster-init.sh), replication
#                    (masteruser/masterauth), the health check, operators
#   hycache-agent    the agents: the DHT's keys (~hc:*) with data, scripting and cluster
#   hycache-control  the control plane: the same keys and commands (it reads the namespace
#                    and writes the node registry's entries like an agent)
#   (no CONFIG, DEBUG, MODULE, FLUSH*, KEYS, SHUTDOWN, ... for either: -@dangerous, and no
#   pub/sub channels)
#
# Then runs redis-server with ARGS (default: the demo's redis.conf) as the redis user.
set -eu
SECRETS=${SECRETS:-/run/secrets}
NAMESPACE=${HYCACHE_DHT_NAMESPACE:-hc}
pw() { # pw NAME -> the password in $SECRETS/NAME (one line)
    [ -s "$SECRETS/$1" ] || { echo "redis-start: missing secret $SECRETS/$1 (sh deploy/gen-secret.sh)" >&2; exit 1; }
    tr -d '\r\n' < "$SECRETS/$1"
}
admin=$(pw hycache_redis_admin_password)
agent=$(pw hycache_redis_agent_password)
control=$(pw hycache_redis_control_password)
# what the DHT client needs (hycache_dht.cluster_client over redis-py's RedisCluster):
# hashes/strings/keyspace reads and writes, Lua scripts, WAIT, and the cluster topology
rules="resetkeys ~$NAMESPACE:* resetchannels -@all +@read +@write +@scripting +@connection +@transaction"
rules="$rules -@dangerous -function -script|flush -script|kill"
rules="$rules +cluster|slots +cluster|shards +cluster|nodes +cluster|info +cluster|myid +cluster|keyslot"
rules="$rules +command +info +time +wait +readonly +readwrite +asking +client|setname +client|id"
umask 077
acl=$(mktemp /tmp/redis-acl.XXXXXX)
# the default user: off, no password (no one logs in as it), every permission: Redis 7.0
# replays the MULTI/EXEC of a script's effects from the AOF with the default user's
# permissions, and would drop every one of them at a restart (redis/redis#14541)
cat > "$acl" <<ACL
user default off resetpass ~* &* +@all
user hycache-admin on >$admin ~* &* +@all
user hycache-agent on >$agent $rules
user hycache-control on >$control $rules
masteruser hycache-admin
masterauth $admin
ACL
[ $# -gt 0 ] || set -- /usr/local/etc/redis/redis.conf
if [ "$(id -u)" = 0 ] && id redis >/dev/null 2>&1; then
    chown redis "$acl"
    chown -R redis:redis /data 2>/dev/null || true
    exec setpriv --reuid=redis --regid=redis --init-groups redis-server "$@" --include "$acl"
fi
exec redis-server "$@" --include "$acl"
