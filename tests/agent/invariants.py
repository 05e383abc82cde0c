"""Invariants of the tiering engine, checked after every operation of the engine tests.

``check_invariants(engine)`` inspects the engine's in-memory state and the tier
directories on disk and raises ``AssertionError`` with every violation it finds.
``settle(engine)`` waits (inside trio) until background work (promotions, the evictor,
spawned migrations) has finished, so that the strict "idle" invariants apply.
``check_persisted(engine)`` compares the SQLite metadata with the in-memory namespace.

These are plain functions over the engine's public-ish state, reusable from any test
that has a live ``TieringEngine`` (engine tests, or a future in-process mount test).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections import Counter

import trio
import trio.testing
from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import ROOT_INO


class InvariantError(AssertionError):
    pass


def _blob_files(engine) -> dict[str, dict[str, bool]]:
    """tier name -> {path of every file under <tier>/data: is_temp}."""
    out: dict[str, dict[str, bool]] = {}
    for name, tier in engine.tiers.items():
        out[name] = {path: temp for path, _ino, temp in tier.scan()} if tier.data_dir.is_dir() else {}
    return out


def check_invariants(engine, *, idle: bool = True) -> None:
    """Raise InvariantError listing every broken invariant.

    ``idle=True`` (no operation or migration in flight) adds the exact checks: no temp
    files, no second copy of any blob, exact fast-tier accounting.
    """
    ns = engine.ns
    problems: list[str] = []
    files = _blob_files(engine)
    migrating = {ino for ino, inode in ns.inodes.items() if inode.migration is not None} | set(engine.active)
    if idle and migrating:
        problems.append(f"migrations still active while idle: {sorted(migrating)}")

    # -- the namespace itself ---------------------------------------------------------
    name_count: Counter[int] = Counter()
    subdirs: Counter[int] = Counter()
    for parent, entries in ns.children.items():
        if parent not in ns.inodes:
            problems.append(f"directory {parent} has entries but no inode")
            continue
        if not ns.inodes[parent].is_dir:
            problems.append(f"inode {parent} has entries but is not a directory")
        for name, ino in entries.items():
            if not isinstance(name, bytes) or not name or b"/" in name or len(name) > 255:
                problems.append(f"bad entry name {name!r} in directory {parent}")
            inode = ns.inodes.get(ino)
            if inode is None:
                problems.append(f"entry {parent}/{name!r} points to missing inode {ino}")
                continue
            name_count[ino] += 1
            if inode.is_dir:
                subdirs[parent] += 1
                if ns.parent.get(ino) != parent:
                    problems.append(f"directory {ino} ({name!r}) is in {parent} but its parent is "
                                    f"recorded as {ns.parent.get(ino)}")
    if ROOT_INO not in ns.inodes or not ns.inodes[ROOT_INO].is_dir:
        problems.append("the root inode is missing or not a directory")
    for ino, inode in ns.inodes.items():
        if inode.ino != ino:
            problems.append(f"inode table key {ino} holds inode {inode.ino}")
        if inode.is_dir and inode.nlink == 0:  # removed, still referenced by the kernel
            if name_count[ino] or ino in ns.children:
                problems.append(f"removed directory {ino} still has a name or an entry table")
        elif inode.is_dir:
            if ino not in ns.children:
                problems.append(f"directory {ino} has no entry table")
            elif inode.nlink != 2 + subdirs[ino]:
                problems.append(f"directory {ino}: nlink {inode.nlink} != 2 + {subdirs[ino]} subdirectories")
            if ino != ROOT_INO and name_count[ino] != 1:
                problems.append(f"directory {ino} has {name_count[ino]} names")
        else:
            if inode.nlink != name_count[ino]:
                problems.append(f"inode {ino}: nlink {inode.nlink} != {name_count[ino]} entries naming it")
            if inode.nlink == 0 and inode.open_count == 0 and inode.lookups == 0:
                problems.append(f"inode {ino} has no name, no handle and no lookup but is still live")
        if stat.S_ISLNK(inode.mode) and (inode.target is None or inode.size != len(inode.target)):
            problems.append(f"symlink {ino}: size {inode.size} != len(target {inode.target!r})")
        if not inode.is_reg and inode.tier is not None:
            problems.append(f"non-regular inode {ino} has a tier {inode.tier!r}")
    if ns.next_ino <= max(ns.inodes):
        problems.append(f"next_ino {ns.next_ino} <= largest live inode {max(ns.inodes)}")

    # -- blobs --------------------------------------------------------------------------
    expected: set[str] = set()
    fast_bytes = 0
    fast_inos: set[int] = set()
    for ino, inode in ns.inodes.items():
        if not inode.is_reg:
            continue
        if inode.tier not in engine.tiers:
            problems.append(f"regular inode {ino} has tier {inode.tier!r}")
            continue
        own = engine.tiers[inode.tier].blob(ino)
        expected.add(own)
        if own not in files[inode.tier]:
            problems.append(f"inode {ino}: its blob {own} is missing on its tier {inode.tier}")
        else:
            size = os.stat(own).st_size
            if size != inode.size:
                problems.append(f"inode {ino}: blob size {size} != inode size {inode.size}")
        for other_name, other in engine.tiers.items():
            if other_name == inode.tier:
                continue
            if other.blob(ino) in files[other_name]:
                if idle or ino not in migrating:
                    problems.append(f"inode {ino} (on {inode.tier}) also has a blob on {other_name}")
                else:
                    expected.add(other.blob(ino))
            if other.temp_blob(ino) in files[other_name] and not idle and ino in migrating:
                expected.add(other.temp_blob(ino))
        if inode.tier == T.FAST:
            fast_bytes += inode.size
            fast_inos.add(ino)
    # empty blobs made ahead of time for future creates (fs/blobpool.py)
    blobs = engine.blobs
    pool = set(blobs.ready) | set(blobs.pool_filling)
    for ino in pool:
        if ino in ns.inodes:
            problems.append(f"inode {ino} is live but also in the pool of spare blobs")
        spare = engine.tiers[T.FAST].blob(ino)
        if spare in files[T.FAST]:
            expected.add(spare)
            if os.stat(spare).st_size != 0:
                problems.append(f"spare blob {spare} is not empty")
    for tier_name, paths in files.items():
        for path, temp in paths.items():
            if path in expected:
                continue
            if temp:
                problems.append(f"leftover temp file {path}" + (" while idle" if idle else ""))
            else:
                problems.append(f"blob {path} on {tier_name} belongs to no live inode on that tier")

    # -- accounting and the policy --------------------------------------------------------
    if idle:
        if engine.fast_used != fast_bytes + engine.remote_cache_used:
            problems.append(f"fast_used {engine.fast_used} != {fast_bytes} bytes of fast-tier files "
                            f"+ {engine.remote_cache_used} of remote copies")
    elif engine.fast_used < 0:
        problems.append(f"fast_used is negative: {engine.fast_used}")
    policy_keys = list(engine.policy.eviction_order())
    if len(policy_keys) != len(set(policy_keys)):
        problems.append(f"policy yields duplicate keys: {policy_keys}")
    if len(engine.policy) != len(set(policy_keys)):
        problems.append(f"len(policy) {len(engine.policy)} != {len(set(policy_keys))} keys it yields")
    if idle and set(policy_keys) != fast_inos:
        problems.append(f"policy holds {sorted(set(policy_keys))}, fast tier holds {sorted(fast_inos)}: "
                        f"extra {sorted(set(policy_keys) - fast_inos)}, missing {sorted(fast_inos - set(policy_keys))}")

    # -- handles --------------------------------------------------------------------------
    opens: Counter[int] = Counter()
    for fh, h in engine.handles.items():
        opens[h.inode.ino] += 1
        if ns.inodes.get(h.inode.ino) is not h.inode:
            problems.append(f"handle {fh} refers to inode {h.inode.ino} which is no longer live")
    for ino, inode in ns.inodes.items():
        if inode.open_count != opens[ino]:
            problems.append(f"inode {ino}: open_count {inode.open_count} != {opens[ino]} handles")

    if problems:
        raise InvariantError("engine invariants violated:\n  " + "\n  ".join(problems))


async def settle(engine, timeout: float = 30.0) -> None:
    """Wait until no task is runnable, no migration is active, the evictor has nothing
    left to do and no freed blob waits for its removal — twice in a row, a few ms apart (a
    spawned migration task or an evictor retry may be between two steps).  A task waiting
    for a worker thread counts as blocked for trio, so the reaper's removal, which runs on
    one, is waited for by name: a test asserting that a freed blob is gone saw it still
    there once on a loaded CI machine."""
    quiet = 0
    with trio.fail_after(timeout):
        while quiet < 2:
            await trio.testing.wait_all_tasks_blocked(cushion=0.005)
            evicting = engine.placement.eviction_pending()
            if (engine.active or evicting or engine.blobs.reaping
                    or any(i.migration is not None for i in engine.ns.inodes.values())):
                quiet = 0
                await trio.sleep(0.01)
            else:
                quiet += 1
                await trio.sleep(0.002)


def check_persisted(engine) -> None:
    """The SQLite store matches the in-memory namespace (call after journal.sync()).

    Opens its own read-only connection (WAL allows a reader beside the writer)."""
    from hycache_agent.fs.metastore import INODE_COLUMNS

    ns = engine.ns
    db = sqlite3.connect(f"file:{engine.store.path}?mode=ro", uri=True)
    try:
        rows = {r[0]: tuple(r) for r in db.execute(f"SELECT {', '.join(INODE_COLUMNS)} FROM inodes")}
        dentries = {(p, bytes(n)): i for p, n, i in db.execute("SELECT parent, name, ino FROM dentries")}
        xattrs = {(i, bytes(n)): bytes(v) for i, n, v in db.execute("SELECT ino, name, value FROM xattrs")}
    finally:
        db.close()
    problems = []
    mem_rows = {ino: inode.row() for ino, inode in ns.inodes.items()}
    for ino in sorted(set(rows) | set(mem_rows)):
        disk, mem = rows.get(ino), mem_rows.get(ino)
        if disk is not None and mem is not None:
            disk = tuple(bytes(v) if isinstance(v, memoryview) else v for v in disk)
        if disk != mem:
            problems.append(f"inode {ino}: stored {disk} != in memory {mem}")
    mem_dentries = {(p, n): i for p, entries in ns.children.items() for n, i in entries.items()}
    if dentries != mem_dentries:
        problems.append(f"entries differ: only stored {sorted(set(dentries.items()) - set(mem_dentries.items()))}, "
                        f"only in memory {sorted(set(mem_dentries.items()) - set(dentries.items()))}")
    mem_x = {(ino, n): v for ino, inode in ns.inodes.items() for n, v in inode.xattrs.items()}
    if xattrs != mem_x:
        problems.append(f"xattrs differ: stored {xattrs} != in memory {mem_x}")
    if problems:
        raise InvariantError("stored metadata differs from the namespace:\n  " + "\n  ".join(problems))
