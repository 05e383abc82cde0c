"""Multi-slot protocols of the Redis engine, and fsck (docs/dht.md tells them step by step).

* mkdir: entry in the parent's hash, then the live header of the new directory's hash.
* rmdir: tombstone the directory's hash (atomic emptiness check; creates are refused from
  then on), delete the entry from the parent's hash, drop the hash.
* rename across slots (any rename of a directory, any rename of a file between two
  directories): intent record, pin the source entry, freeze the source subtree and prepare
  its target hashes, write the (pinned) destination entry, copy the subtree, delete the
  source entry, drop the old hashes, unfreeze the new ones, unpin, clear the intent.

Every step is one replay-safe script on one key, and is named to :meth:`_step` (tests raise
from the hook to simulate a crash after it). fsck finishes or undoes what a crash left,
from what it finds: the intent log for renames, the tombstone (with the entry's version)
for rmdir, a dir entry without a header for mkdir.
"""

from __future__ import annotations

import errno
import time
from collections import deque
from typing import Any

import msgpack

from . import keys, paths
from .cluster_client import Item
from .lua import (
    ST_CASFAIL,
    ST_GONE,
    ST_NOTDIR,
    ST_NOTEMPTY,
    ST_NOTFOUND,
    ST_OK,
)
from .meta import (
    PROBLEMS,
    DHTBusy,
    EntryMeta,
    FsckReport,
    RenameAborted,
    check_destination,
    dir_meta,
    invalid,
    new_report,
    not_empty,
)
from .redis_base import E_KIND, E_PIN, E_VER, RedisBase, fields, header, new_id


class _Abort(Exception):
    """Stop a rename before its destination was written: roll back, then raise ``error``
    (or, with ``error=None``, start again: it met another rename)."""

    def __init__(self, error: BaseException | None = None) -> None:
        super().__init__(error)
        self.error = error


class CrossSlotProtocols(RedisBase):
    """The multi-slot half of :class:`~hycache_dht.redis_store.RedisClusterStore`."""

    #: the steps of a rename across slots, in order (the hook sees them; docs/dht.md)
    RENAME_STEPS = ("intent", "pin", "tombdst", "freeze", "dst", "stage", "copy", "src",
                    "drop", "live", "unpin", "clear")

    # -- mkdir, rmdir ---------------------------------------------------------------------

    def _mkhdr(self, path: bytes) -> None:
        """mkdir step 2: the new directory's own hash gets its live header."""
        self._step("mkdir:entry")
        self._sc("mkhdr", self._dkey(path), path)
        self._step("mkdir:header")

    def _rmdir(self, path: bytes, version: int, expect_version: int | None) -> bool:
        """tombstone the directory's own hash -> delete the entry -> drop the hash."""
        key, name, _ = self._loc(path)
        own = self._dkey(path)
        token = new_id()
        self._active.add(token)
        self._mine.add(token)
        try:
            while True:
                r, _ = self._sc("tomb", own, path, token, version)
                if r[0] == ST_NOTEMPTY:
                    self._mine.discard(token)
                    raise not_empty(path)
                if r[0] == ST_GONE:
                    self._mine.discard(token)
                    return False  # removed already (or being removed by someone else)
                self._step("rmdir:tomb")
                r, ambiguous = self._sc("deldir", key, name, str(version))
                if r[0] == ST_NOTFOUND and not ambiguous:  # moved away meanwhile
                    self._sc("dropgone", own, token)
                    self._mine.discard(token)
                    return False
                if r[0] in (ST_CASFAIL, ST_NOTDIR):
                    self._sc("untomb", own, token)
                    if r[0] == ST_NOTDIR or expect_version is not None:
                        self._mine.discard(token)
                        return False
                    version = int(r[1])  # changed meanwhile (chmod...): remove that one
                    continue
                # OK, or NOTFOUND after a lost reply: our own earlier attempt
                self._step("rmdir:entry")
                self._sc("dropgone", own, token)
                self._step("rmdir:drop")
                self._mine.discard(token)
                return True
        finally:
            self._active.discard(token)

    # -- rename ---------------------------------------------------------------------------

    def rename(self, src: bytes, dst: bytes, *, replace: bool = True) -> None:
        paths.check(src)
        paths.check(dst)
        if src == paths.ROOT or dst == paths.ROOT:
            raise OSError(errno.EBUSY, "cannot rename the root", src)
        if src == dst:
            if self.get(src) is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", src)
            return
        if paths.is_within(dst, src):
            raise invalid(src, "cannot move a directory into itself")
        sp, sn = paths.split(src)
        dp, dn = paths.split(dst)
        if sp == dp:  # a non-directory within one directory: one script
            r, _ = self._sc("rename1", self._dkey(sp), sn, dn, "1" if replace else "0", new_id())
            if r[0] == ST_OK:
                return
            if r[0] == 1:
                raise FileExistsError(errno.EEXIST, "destination exists", dst)
            if r[0] == ST_NOTFOUND:
                raise FileNotFoundError(errno.ENOENT, "no such file", src)
            if r[0] != 11:  # 11: the source is a directory -> the protocol below
                self._raise(r[0], dst)
        deadline = self._deadline()
        attempt = 0
        while True:
            try:
                return self._rename_once(src, dst, replace, deadline)
            except _Abort as a:
                if a.error is not None:
                    raise a.error from None
            attempt += 1
            self.c.stats["rename_conflict"] += 1
            if time.monotonic() >= deadline:
                raise DHTBusy("rename: source or destination held by other renames")
            time.sleep(self.c.backoff(attempt))

    def _rename_once(self, src: bytes, dst: bytes, replace: bool, deadline: float) -> None:
        dp, dn = paths.split(dst)
        s, d, pm = self.get_many([src, dst, dp])
        if s is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", src)
        check_destination(s, d, dst, replace)
        if pm is None or pm.kind != "dir":
            raise FileNotFoundError(errno.ENOENT, "destination directory missing", dp)
        iid = new_id()
        rec = {"op": "rename", "src": src, "dst": dst, "stage": "begin",
               "dst_dir": d is not None and d.kind == "dir"}
        self._active.add(iid)
        try:
            self._intent_begin(iid, rec)
            self._step("intent")
            try:
                packed = self._lock(iid, src, dst, d)
                self._heartbeat(iid)
                r, _ = self._sc("putdst", self._dkey(dp), dn, iid, str(d.version if d else 0),
                                dp, packed, wait_busy=False, deadline=deadline)
                if r[0] == ST_NOTFOUND:
                    raise _Abort(FileNotFoundError(errno.ENOENT, "destination directory removed", dp))
                if r[0] != ST_OK:
                    raise _Abort()  # destination changed or held: start again
            except _Abort:
                self._rollback(iid, rec)
                raise
            self._step("dst")
            rec["stage"] = "dst"
            self.c.one(self._rec_key, ("HSET", self._rec_key, iid, msgpack.packb(rec)))
            self._step("stage")
            self._forward(iid, rec, heartbeat=True)
        finally:
            self._active.discard(iid)

    def _lock(self, iid: str, src: bytes, dst: bytes, d: EntryMeta | None) -> bytes:
        """Pin the source entry, claim a replaced directory, freeze the source subtree and
        prepare its targets. Anything held by another operation aborts: no waiting while
        holding, so no deadlock."""
        sp, sn = paths.split(src)
        r, _ = self._sc("pin", self._dkey(sp), sn, iid, wait_busy=False)
        if r[0] == ST_NOTFOUND:
            raise _Abort(FileNotFoundError(errno.ENOENT, "no such file", src))
        if r[0] != ST_OK:
            raise _Abort()
        packed: bytes = r[1]
        self._step("pin")
        if d is not None and d.kind == "dir":
            r, _ = self._sc("tombdst", self._dkey(dst), dst, iid, wait_busy=False)
            if r[0] == ST_NOTEMPTY:
                raise _Abort(not_empty(dst))
            if r[0] != ST_OK:
                raise _Abort()
            self._step("tombdst")
        if fields(packed)[E_KIND] == b"dir":
            queue = deque([src])
            while queue:
                p = queue.popleft()
                r, _ = self._sc("freeze", self._dkey(p), p, iid, wait_busy=False)
                if r[0] != ST_OK:
                    raise _Abort()
                q = paths.rebase(p, src, dst)
                r, _ = self._sc("preptgt", self._dkey(q), q, iid, wait_busy=False)
                if r[0] != ST_OK:
                    raise _Abort()
                self._step("freeze")
                queue.extend(self._subdirs(p))
        return packed

    def _subdirs(self, p: bytes) -> list[bytes]:
        return [paths.join(p, name) for name, raw in self._hscan(self._dkey(p))
                if fields(raw)[E_KIND] == b"dir"]

    def _frozen_tree(self, top: bytes, iid: str) -> list[bytes]:
        """Directories at and below ``top`` whose hash ``iid`` froze, top-down (a frozen
        directory's parent is frozen too, so the walk stops at the first that is not)."""
        out: list[bytes] = []
        queue = deque([top])
        while queue:
            p = queue.popleft()
            k = self._dkey(p)
            _, state, hid, _, _ = header(self._read(k, "HGET", k, keys.HEADER))
            if state == "moving" and hid == iid:
                out.append(p)
                queue.extend(self._subdirs(p))
        return out

    def _forward(self, iid: str, rec: dict[str, Any], *, heartbeat: bool) -> None:
        """Finish a rename whose destination entry is written (idempotent: the old
        hashes are dropped bottom-up, so a repeat walks what is left)."""
        src, dst = rec["src"], rec["dst"]
        sp, sn = paths.split(src)
        dp, dn = paths.split(dst)
        old_dirs = self._frozen_tree(src, iid)
        for n, p in enumerate(old_dirs):
            if heartbeat and n % 16 == 15:
                self._heartbeat(iid)
            ok, qk = self._dkey(p), self._dkey(paths.rebase(p, src, dst))
            counter = self._read(ok, "HGET", ok, keys.COUNTER) or b"0"
            batch: list[bytes] = []
            for name, raw in self._hscan(ok):
                batch += [name, raw]
                if len(batch) >= 2 * self.scan_count:
                    self._sc("copy", qk, iid, counter, *batch)
                    batch = []
            self._sc("copy", qk, iid, counter, *batch)
            self._step("copy")
        self._sc("delsrc", self._dkey(sp), sn, iid)
        self._step("src")
        for p in reversed(old_dirs):
            self._sc("dropold", self._dkey(p), iid)
            self._step("drop")
        for q in reversed(self._frozen_tree(dst, iid)):
            self._sc("unfreeze", self._dkey(q), iid)
            self._step("live")
        self._sc("unpin", self._dkey(dp), dn, iid)
        self._step("unpin")
        self._intent_end(iid)
        self._step("clear")

    def _rollback(self, iid: str, rec: dict[str, Any]) -> None:
        """Undo a rename whose destination entry was not written (idempotent)."""
        src, dst = rec["src"], rec["dst"]
        sp, sn = paths.split(src)
        for p in self._frozen_tree(src, iid):
            q = paths.rebase(p, src, dst)
            keep = "1" if q == dst and rec.get("dst_dir") else "0"
            self._sc("unprep", self._dkey(q), iid, keep)
            self._sc("unfreeze", self._dkey(p), iid)
        self._sc("untomb", self._dkey(dst), iid)
        self._sc("unpin", self._dkey(sp), sn, iid)
        self._intent_end(iid)

    # -- intent log -----------------------------------------------------------------------

    def _intent_begin(self, iid: str, rec: dict[str, Any]) -> None:
        k1, k2 = self._rec_key, self._own_key
        self.c.one(k1, ("EVALSHA", self.c.scripts["intent_begin"][0], 2, k1, k2, iid,
                        msgpack.packb(rec), self.owner, int(self.intent_timeout * 1000)))

    def _intent_end(self, iid: str) -> None:
        k1, k2 = self._rec_key, self._own_key
        self.c.one(k1, ("EVALSHA", self.c.scripts["intent_end"][0], 2, k1, k2, iid))

    def _claim(self, iid: str) -> bool:
        r, _ = self._sc("intent_claim", self._own_key, iid, self.owner,
                        int(self.intent_timeout * 1000))
        return bool(r[0] == ST_OK and r[1] == 1)

    def _heartbeat(self, iid: str) -> None:
        if not self._claim(iid):
            raise RenameAborted(f"intent {iid} was taken over (deadline passed)")

    def _intents(self) -> dict[str, tuple[dict[str, Any], str, int]]:
        recs = self._read(self._rec_key, "HGETALL", self._rec_key) or {}
        owners = self._read(self._own_key, "HGETALL", self._own_key) or {}
        out = {}
        for iid, raw in recs.items():
            owner, _, deadline = owners.get(iid, b"|0").decode().rpartition("|")
            out[iid.decode()] = (msgpack.unpackb(raw, raw=False), owner, int(float(deadline)))
        return out

    # -- fsck -----------------------------------------------------------------------------

    def fsck(self, repair: bool = False) -> FsckReport:
        rep = new_report(repair)
        now = self._server_ms()
        # 1. interrupted renames, from the intent log
        pending: set[str] = set()
        for iid, (rec, owner, deadline) in self._intents().items():
            if iid in self._active or not (owner == self.owner or deadline < now):
                rep["busy"] += 1  # its owner may still be working on it
                pending.add(iid)
                continue
            rep["intents"] += 1
            forward = self._rename_decision(iid, rec)
            if not repair:  # report what a repair would do
                pending.add(iid)
                rep["rolled_forward" if forward else "rolled_back"] += 1
                continue
            if not self._claim(iid):  # its owner came back just now
                pending.add(iid)
                rep["intents"] -= 1
                rep["busy"] += 1
                continue
            if forward:
                self._forward(iid, rec, heartbeat=False)
            else:
                self._rollback(iid, rec)
            rep["rolled_forward" if forward else "rolled_back"] += 1
        # 2. every directory hash of the namespace
        for conn in self.c.primaries():
            for k in conn.scan_iter(match=keys.dir_key_pattern(self.ns), count=1000):
                self._fsck_hash(k, pending, repair, rep, now)
        rep["problems"] = sum(rep[n] for n in PROBLEMS)
        return rep

    def _server_ms(self) -> int:
        t = self._read(self._own_key, "TIME")
        return int(t[0]) * 1000 + int(t[1]) // 1000

    def _rename_decision(self, iid: str, rec: dict[str, Any]) -> bool:
        """Roll forward iff the destination entry was written (the stage says so, or the
        destination is still pinned by this intent - it stays pinned until the end)."""
        if rec.get("stage") == "dst":
            return True
        raw, _ = self._raw_entry(rec["dst"])
        return raw is not None and fields(raw)[E_PIN].decode() == iid

    def _expired(self, owner: str, since: int, now: int) -> bool:
        """May fsck finish an rmdir/mkdir started by ``owner`` at ``since``?"""
        if owner in self._active:
            return False
        return owner in self._mine or now - since > self.intent_timeout * 1000

    def _fsck_hash(self, k: bytes, pending: set[str], repair: bool, rep: FsckReport, now: int) -> None:
        label, state, owner, since, extra = header(self._read(k, "HGET", k, keys.HEADER))
        if owner and owner in pending:
            return  # a live (or not yet expired) rename owns it
        if label is None or k != self._dkey(label):
            rep["unlabelled"] += 1  # not written by this module; left alone
            return
        if state == "gone":
            self._fsck_tombstone(k, label, owner, since, extra, repair, rep, now)
            return
        if state == "moving":
            rep["stale_freezes"] += 1  # its intent is gone: nobody will finish it
            if repair:
                self._sc("unfreeze", k, owner)
        rep["dirs"] += 1
        subdirs = []
        for name, raw in self._hscan(k):
            rep["entries"] += 1
            f = fields(raw)
            pin = f[E_PIN].decode()
            if pin and pin not in pending:
                rep["stale_pins"] += 1
                if repair:
                    self._sc("unpin", k, name, pin)
            if f[E_KIND] == b"dir" and label != paths.ROOT_PARENT:
                subdirs.append(paths.join(label, name))
        self._fsck_headers(subdirs, repair, rep)
        if label in (paths.ROOT_PARENT, paths.ROOT):
            return
        entry, pstate = self._raw_entry(label)
        if entry is not None and pstate != "gone" and fields(entry)[E_KIND] == b"dir":
            return
        rep["orphan_dirs"] += 1  # a live directory hash without a directory entry
        if repair and header(self._read(k, "HGET", k, keys.HEADER))[1] == "live":
            self._resurrect(label, rep)

    def _fsck_headers(self, dirs: list[bytes], repair: bool, rep: FsckReport) -> None:
        """Directory entries whose own hash has no header: mkdir stopped after the entry."""
        items = [Item(k, ("HGET", k, keys.HEADER), write=False) for k in map(self._dkey, dirs)]
        self.c.run(items)
        for d, it in zip(dirs, items):
            if it.result is None:
                rep["headerless"] += 1
                if repair:
                    self._mkhdr(d)

    def _fsck_tombstone(self, k: bytes, label: bytes, owner: str, since: int, version: int,
                        repair: bool, rep: FsckReport, now: int) -> None:
        """A tombstoned hash: an rmdir that did not finish, or a rename that replaced a
        directory (its intent decides that one)."""
        raw, _ = self._raw_entry(label)
        entry_version = fields(raw)[E_VER] if raw is not None else None
        if entry_version is not None and entry_version == version:
            # stopped between tombstone and entry removal: finish the rmdir
            if not self._expired(owner, since, now):
                rep["busy"] += 1
                return
            rep["tombstones"] += 1
            if repair:
                pk, name, _ = self._loc(label)
                self._sc("deldir", pk, name, str(version))
                self._sc("dropgone", k, owner)
                self._mine.discard(owner)
            return
        rep["tombstones"] += 1
        if repair:
            if entry_version is not None:  # a new directory took the path before the drop
                self._mkhdr(label)
            else:  # stopped after removing the entry
                self._sc("dropgone", k, owner)
                self._mine.discard(owner)

    def _resurrect(self, path: bytes, rep: FsckReport) -> None:
        """Re-create ``path`` and its missing ancestors as directories (nothing is lost)."""
        missing = []
        p = path
        while p != paths.ROOT:
            m = self.get(p)
            if m is not None and m.kind == "dir":
                break
            missing.append(p)
            p = paths.split(p)[0]
        for p in reversed(missing):
            if self.put(p, dir_meta(0o755), expect_version=0) is not None:
                rep["resurrected_dirs"] += 1
