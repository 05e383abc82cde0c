#!/bin/sh
# Entry point of the HyCache agent image: takes `hycache-agent` arguments.
#
# For `mount ROOT MNT ...` it first creates MNT and removes a FUSE mount that a killed
# agent left there (a dead FUSE mount answers ENOTCONN and the agent refuses to mount
# over a mount point). Only a FUSE mount is removed: MNT itself may be a bind mount that
# exports the file system to the host (docker-compose.yml), and that one must stay.
# Then it execs the agent, which stays in the foreground and unmounts on SIGTERM.
set -eu

if [ "${1:-}" = mount ] && [ $# -ge 3 ]; then
    mnt=$3
    case $mnt in /*) ;; *) mnt=$PWD/$mnt ;; esac
    while [ "$mnt" != / ] && [ "${mnt%/}" != "$mnt" ]; do mnt=${mnt%/}; done
    # /proc/self/mountinfo: field 5 is the mount point, the field after " - " the type.
    # (First: mkdir -p on a dead FUSE mount fails with ENOTCONN.)
    for _ in 1 2 3; do  # (a few, in case crashed agents stacked several)
        awk -v m="$mnt" '$5 == m { for (i = 6; i <= NF; i++) if ($i == "-") { if ($(i + 1) ~ /^fuse/) found = 1; break } }
                         END { exit !found }' /proc/self/mountinfo || break
        echo "hycache-agent-entrypoint: removing a stale FUSE mount at $mnt" >&2
        fusermount3 -uz "$mnt" || umount -l "$mnt"
    done
    mkdir -p "$mnt"
    # The kernel's trace points let the agent count the bytes the kernel reads for its
    # passthrough opens (docs/agent.md, "Bytes the kernel moves"); a container has no
    # tracefs unless it mounts one (CAP_SYS_ADMIN, which FUSE needs anyway). Without it
    # the agent runs as well and reports those reads as not counted.
    if [ -d /sys/kernel/tracing ] && [ ! -e /sys/kernel/tracing/instances ]; then
        mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null \
            || echo "hycache-agent-entrypoint: no tracefs: passthrough reads are not counted" >&2
    fi
fi
exec hycache-agent "$@"
