"""Start-up after a crash: the name changes only the redo log kept (:func:`replay`), then
the recovery pass over the tiers' blobs (:func:`recover`).  Both run before the event
loop serves requests, on the loaded namespace."""

from __future__ import annotations

import logging
import os

from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import ROOT_INO, Namespace
from hycache_agent.fs.redolog import RedoLog

log = logging.getLogger(__name__)


def replay(ns: Namespace, redo: RedoLog, checkpoint: int) -> int:
    """(start-up) The name changes a crash left only in the redo log, applied to the
    loaded namespace before the recovery pass (which would take their blobs for
    orphans); committed with the start-up's commit, the checkpoint with them."""
    records = redo.pending(checkpoint)
    if not records:
        return 0
    ns.events = []  # kept for the cluster link (attached later) to publish
    try:
        applied = ns.replay(records)
    finally:
        ns.replayed_events, ns.events = ns.events, None
    ns.journal.counter("redo_upto", redo.last_seq)
    log.warning("redo log: %d name changes after the last commit (%d applied)", len(records), applied)
    return applied


def recover(ns: Namespace, tiers: dict[str, T.Tier]) -> dict[str, int]:
    """Resolve what a crash left: staged copies, duplicate copies of a migrated file,
    blobs of deleted inodes, nameless inodes; refresh sizes from the blobs."""
    report = {"temp_removed": 0, "duplicates_removed": 0, "orphan_blobs_removed": 0,
              "orphan_inodes_removed": 0, "missing_blobs": 0, "sizes_fixed": 0}
    referenced = {ino for entries in ns.children.values() for ino in entries.values()}
    for node in list(ns.inodes.values()):
        if node.ino != ROOT_INO and (node.nlink <= 0 or node.ino not in referenced):
            ns.forget_inode(node)
            report["orphan_inodes_removed"] += 1
    for tier in tiers.values():
        for path, ino, temp in tier.scan():
            inode = ns.inodes.get(ino) if ino is not None else None
            if temp:
                T.remove_blob(path)
                report["temp_removed"] += 1
            elif inode is None or not inode.is_reg:
                T.remove_blob(path)
                report["orphan_blobs_removed"] += 1
            elif inode.tier != tier.name:
                # the switch committed (or never did) — the metadata names the copy to keep
                other = tiers[inode.tier] if inode.tier in tiers else None
                if other is not None and os.path.exists(other.blob(inode.ino)):
                    T.remove_blob(path)
                    report["duplicates_removed"] += 1
                else:  # only this copy exists: adopt it (never lose bytes)
                    inode.tier = tier.name
                    ns.journal.inode(inode.ino)
    for inode in ns.inodes.values():
        if not inode.is_reg:
            continue
        try:
            st = os.stat(tiers[inode.tier or ""].blob(inode.ino))  # (no tier: KeyError)
        except (FileNotFoundError, KeyError):
            log.error("inode %d (%r): its bytes are missing on every tier; recreated empty",
                      inode.ino, ns.path_of(inode.ino))
            inode.tier = T.FAST
            T.create_blob(tiers[T.FAST].blob(inode.ino))
            inode.size = 0
            ns.journal.inode(inode.ino)
            report["missing_blobs"] += 1
            continue
        if st.st_size != inode.size:
            inode.size = st.st_size
            ns.journal.inode(inode.ino)
            report["sizes_fixed"] += 1
    if any(report.values()):
        log.warning("recovery: %s", report)
    return report
