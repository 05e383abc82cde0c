"""fs/counters.py alone: the counting and the report shapes, without a mount or an engine
(the status of a running engine is checked in test_control_link.py)."""

from __future__ import annotations

import os
import stat

import trio
from hycache_agent.fs import counters as C
from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import Inode


def _inode(ino: int, mode: int, tier: str | None = None, size: int = 0) -> Inode:
    return Inode(ino=ino, mode=mode, uid=0, gid=0, tier=tier, size=size)


def test_counters_dict_has_the_heartbeat_shape_and_sums_migration_bytes():
    io, counters = C.IOStats(), C.Counters()
    io.tiers[T.FAST].reads += 2
    io.tiers[T.FAST].read_bytes += 100
    io.tiers[T.SLOW].hits += 1
    io.misses += 1
    io.remote_opens += 3
    io.remote_read_bytes += 7
    io.metadata_ops += 5
    counters.migrations_done = 2
    counters.bytes_promoted, counters.bytes_demoted = 10, 20
    d = C.counters_dict(io, counters)
    assert d == {
        "fast": {"read_bytes": 100, "write_bytes": 0, "reads": 2, "writes": 0, "hits": 0,
                 "kernel_read_bytes": 0, "grown_bytes": 0},
        "slow": {"read_bytes": 0, "write_bytes": 0, "reads": 0, "writes": 0, "hits": 1,
                 "kernel_read_bytes": 0, "grown_bytes": 0},
        "remote": {"read_bytes": 7, "fetches": 0, "fetch_bytes": 0, "opens": 3},
        "misses": 1, "metadata_ops": 5, "migrations": 2, "migration_bytes": 30,
        "promoted_bytes": 10, "evicted_bytes": 20, "counting": None,
    }
    # the kernel's reads (traced) and files' growth (passthrough writes) are part of the
    # tier's read and write bytes, and also shown apart
    C.take_kernel_reads(io, {T.SLOW: 4096})
    C.grew(io, T.FAST, 50)
    C.grew(io, T.FAST, -8)  # shrunk: nothing written counted
    d = C.counters_dict(io, counters, counting=C.counting(True, {"active": True}))
    assert d["slow"]["read_bytes"] == d["slow"]["kernel_read_bytes"] == 4096
    assert d["fast"]["write_bytes"] == d["fast"]["grown_bytes"] == 50
    assert d["counting"] == {"passthrough": True, "reads": "traced", "writes": "growth",
                             "kernel_reads": {"active": True}}
    assert C.counting(False, {"active": True})["reads"] == "agent"
    # in a cluster the fetches are the link's counters
    assert C.counters_dict(io, counters, (4, 4096))["remote"] == {
        "read_bytes": 7, "fetches": 4, "fetch_bytes": 4096, "opens": 3}


def test_file_info_names_the_type_and_the_blob_of_regular_files_only():
    f = _inode(5, stat.S_IFREG | 0o644, T.SLOW, 123)
    f.pinned, f.hits, f.open_count = True, 4, 1
    info = C.file_info(f, "/x/slow/data/05/5", "/root", None)
    assert info == {"ino": 5, "type": "file", "tier": "slow", "size": 123, "pinned": True, "hits": 4,
                    "open": 1, "agent_root": "/root", "blob": "/x/slow/data/05/5"}
    f.replicas = ("b",)
    info = C.file_info(f, "/b", "/root", "a")
    assert info["primary"] == "a" and info["replicas"] == ["b"]
    assert C.file_info(_inode(2, stat.S_IFDIR | 0o755), None, "/r", None)["type"] == "dir"
    link = C.file_info(_inode(3, stat.S_IFLNK | 0o777), None, "/r", None)
    assert link["type"] == "symlink" and "blob" not in link
    assert C.file_info(_inode(4, stat.S_IFIFO | 0o600), None, "/r", None)["type"] == "special"


def test_census_counts_files_bytes_and_pinned_bytes_per_tier_and_reuses_a_recent_count_only_when_allowed():
    inodes = {1: _inode(1, stat.S_IFDIR | 0o755)}
    for ino in range(2, 2 + 2 * C.STATUS_SLICE + 3):  # more than two slices: it yields between them
        inodes[ino] = _inode(ino, stat.S_IFREG | 0o644, T.FAST if ino % 2 else T.SLOW, 10)
    inodes[3].pinned = True  # a pinned file on the fast tier: its bytes count as pinned too
    inodes[10**6] = _inode(10**6, stat.S_IFLNK | 0o777)
    n_fast = sum(1 for i in inodes.values() if i.tier == T.FAST)
    n_slow = sum(1 for i in inodes.values() if i.tier == T.SLOW)
    census = C.Census()

    async def main():
        counts, dirs, others = await census.count(inodes, 0)
        assert counts == {T.FAST: [n_fast, 10 * n_fast, 10], T.SLOW: [n_slow, 10 * n_slow, 0]}
        assert (dirs, others) == (1, 1)
        inodes[10**6 + 1] = _inode(10**6 + 1, stat.S_IFREG | 0o644, T.FAST, 1)
        polled = await census.count(inodes, 60)  # a poller accepts the last count
        assert polled[0][T.FAST] == [n_fast, 10 * n_fast, 10]
        exact = await census.count(inodes, 0)  # max_age 0: always counted afresh
        assert exact[0][T.FAST] == [n_fast + 1, 10 * n_fast + 1, 10]

    trio.run(main)


def test_statfs_adds_the_fast_capacity_left_to_the_slow_file_system(tmp_path):
    slow = os.statvfs(tmp_path)
    total, free, files, ffree = C.statfs(1000, 300, slow, 10)
    assert total == 1000 + slow.f_blocks * slow.f_frsize
    assert free == 700 + slow.f_bavail * slow.f_frsize
    assert files == max(slow.f_files, 1_000_010) and ffree == files - 10
    # a fast tier over its capacity (a passthrough writer) counts as full, never negative
    assert C.statfs(1000, 1500, slow, 10)[1] == slow.f_bavail * slow.f_frsize


def test_tier_vfs_is_the_two_tiers_file_systems(tmp_path):
    tiers = {T.FAST: T.Tier(T.FAST, tmp_path / "f"), T.SLOW: T.Tier(T.SLOW, tmp_path / "s")}
    for t in tiers.values():
        t.path.mkdir()
    fast, slow = C.tier_vfs(tiers)
    assert fast.f_blocks == os.statvfs(tmp_path).f_blocks == slow.f_blocks
