"""The global namespace on Redis Cluster (see docs/dht.md for the layout and protocols).

Single-slot operations (this module) are one Lua script on one directory hash (lua.py).
Operations that span slots - mkdir's header, removing a directory, renaming a directory or
across directories - and fsck live in redis_protocols.py; the connection, the entry layout
and the one-key plumbing both use in redis_base.py.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from . import keys, paths
from .cluster_client import Item
from .lua import (
    ST_BUSY,
    ST_CASFAIL,
    ST_EXISTS,
    ST_HELD,
    ST_ISDIR,
    ST_NOTFOUND,
    ST_OK,
)
from .meta import (
    DHTError,
    EntryMeta,
    Op,
    check_meta,
    owners_arg,
    pack_body,
)
from .redis_base import decode_entry, new_id
from .redis_protocols import CrossSlotProtocols

if TYPE_CHECKING:
    from .invalidations import InvalidationFeed


Step = tuple[Any, ...]  # (script name, *its arguments) of one op in RedisClusterStore.apply

# steps of one wave on one directory hash per script call (lua.py ``batch``): a call runs
# atomically on its master, so a large batch holds that master this long at most
BATCH_STEPS = 64


def _exp(expect_version: int | None) -> str:
    if expect_version is None:
        return ""
    if expect_version < 0:
        raise ValueError("expect_version must be >= 0")
    return str(int(expect_version))


class RedisClusterStore(CrossSlotProtocols):
    """:class:`~hycache_dht.meta.MetaStore` on Redis Cluster via redis-py: the single-slot
    operations and batches; the constructor (namespace, client config, intent timeout) and
    the one-key plumbing are :class:`~hycache_dht.redis_base.RedisBase`'s, the protocols
    across slots :class:`~hycache_dht.redis_protocols.CrossSlotProtocols`'."""

    # -- single-slot operations -----------------------------------------------------------

    def create(self, path: bytes, meta: EntryMeta) -> bool:
        check_meta(meta)
        key, name, parent = self._loc(path)
        if path == paths.ROOT:
            return False
        r, _ = self._sc("create", key, parent, name, meta.kind, new_id(), pack_body(meta))
        if r[0] == ST_OK:
            if meta.kind == "dir":
                self._mkhdr(path)
            self._announce_now([path])
            return True
        if r[0] == ST_EXISTS:
            return False
        return self._raise(r[0], path)

    def put(self, path: bytes, meta: EntryMeta, expect_version: int | None = None,
            owners: tuple[str, ...] | None = None) -> int | None:
        check_meta(meta)
        key, name, parent = self._loc(path)
        if path == paths.ROOT and meta.kind != "dir":
            raise NotADirectoryError(errno.ENOTDIR, "the root is a directory", path)
        r, _ = self._sc("put", key, parent, name, meta.kind, new_id(), pack_body(meta),
                        _exp(expect_version), owners_arg(owners))
        if r[0] == ST_OK:
            if r[2]:
                self._mkhdr(path)
            self._announce_now([path])
            return int(r[1])
        if r[0] == ST_CASFAIL:
            return None
        return self._raise(r[0], path, r)

    def delete(self, path: bytes, expect_version: int | None = None) -> bool:
        key, name, _ = self._loc(path)
        if path == paths.ROOT:
            raise OSError(errno.EBUSY, "cannot remove the root", path)
        r, ambiguous = self._sc("delete", key, name, _exp(expect_version))
        if r[0] == ST_OK:
            self._announce_now([path])
            return True
        if r[0] == ST_NOTFOUND:
            return ambiguous  # our own delete whose reply was lost, or never there
        if r[0] == ST_CASFAIL:
            return False
        if r[0] == ST_ISDIR:
            return self._rmdir(path, int(r[1]), expect_version)
        return self._raise(r[0], path)

    def _entries(self, path: bytes) -> Iterator[tuple[bytes, EntryMeta]]:
        for name, raw in self._hscan(self._dkey(path)):
            yield name, decode_entry(raw)

    def list_page(self, path: bytes, position: tuple[int, int] | None, limit: int, prefix: bytes = b"",
                  budget: int = 0) -> tuple[list[tuple[bytes, EntryMeta]], tuple[int, int] | None]:
        """One page of a directory without reading it whole: ``(entries, position of the
        next page or None at the end)``.  The directory's hash is walked with HSCAN from
        ``position`` = (HSCAN cursor, entries of that batch already returned); each batch
        is sorted by name, so a directory that fits one batch (small ones) pages in name
        order, a large one in the hash's order, by batches.  ``prefix`` filters by name
        prefix on the server (MATCH); at most ``budget`` fields (default 20 x limit) are
        visited per page, so a rare prefix may give a short page with a position.
        FileNotFoundError / NotADirectoryError as ``list_dir``."""
        m = self.get(path)
        if m is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        if m.kind != "dir":
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        key = self._dkey(path)
        cursor, skip = position or (0, 0)
        count = max(10, min(limit, 5000))
        match = (b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in prefix) + b"*"
                 if prefix else None)
        out: list[tuple[bytes, EntryMeta]] = []
        visited, budget = 0, budget or 20 * limit
        while True:
            args = ("HSCAN", key, cursor, "COUNT", count) + (("MATCH", match) if match else ())
            nxt, page = self._read(key, *args)
            nxt = int(nxt)
            batch = sorted((n, raw) for n, raw in page.items() if not keys.is_reserved_field(n))
            visited += max(len(page), count)
            room = limit - len(out)
            take = batch[skip:skip + room]
            out += [(n, decode_entry(raw)) for n, raw in take]
            if skip + len(take) < len(batch):  # the page ends inside this batch
                return out, (cursor, skip + len(take))
            cursor, skip = nxt, 0
            if cursor == 0:
                return out, None
            if len(out) >= limit or visited >= budget:
                return out, (cursor, 0)

    def acquire_write(self, path: bytes, node: str, lease_seconds: float) -> bool:
        if not node or "|" in node:
            raise ValueError(f"bad node id {node!r}")
        key, name, _ = self._loc(path)
        r, _ = self._sc("acquire", key, name, node, max(1, int(lease_seconds * 1000)))
        if r[0] == ST_OK:
            return True
        if r[0] == ST_HELD:
            return False
        return self._raise(r[0], path)

    def release_write(self, path: bytes, node: str) -> None:
        key, name, _ = self._loc(path)
        self._sc("release", key, name, node)

    # -- batches --------------------------------------------------------------------------

    def apply(self, ops: list[Op]) -> list[object]:
        """Pipelined: one round trip per master per *wave* (plus WAIT), the wave's steps on
        one directory hash as one script call (lua.py ``batch``, up to BATCH_STEPS each). A
        wave ends before an op whose parent directory the wave creates (the new
        directory's header must be in place first). Per op its method's result, or the
        exception it would raise. A directory removal, or an op that met a rename in
        progress, is finished on its own after its wave."""
        results: list[object] = [None] * len(ops)
        wave: list[tuple[int, bytes, Step]] = []  # (op index, hash key, (script, *argv)); () = on its own
        new_dirs: set[bytes] = set()
        for i, op in enumerate(ops):
            try:
                op.check()
                key, name, parent = self._loc(op.path)
            except (ValueError, TypeError) as e:
                results[i] = e
                continue
            if parent in new_dirs:
                self._apply_wave(ops, wave, results)
                wave, new_dirs = [], set()
            if op.path == paths.ROOT:
                wave.append((i, key, ()))  # answered by _one (rare)
                continue
            if op.op == "delete":
                step: Step = ("delete", name, _exp(op.expect_version))
            elif op.op == "acquire":
                step = ("acquire", name, op.node, max(1, int(op.lease_seconds * 1000)))
            elif op.op == "release":
                step = ("release", name, op.node)
            else:
                m = op.entry()
                step = (op.op, parent, name, m.kind, new_id(), pack_body(m))
                if op.op == "put":
                    step += (_exp(op.expect_version), owners_arg(op.owners))
                if m.kind == "dir":
                    new_dirs.add(op.path)
            wave.append((i, key, step))
        self._apply_wave(ops, wave, results)
        return results

    def _wave_items(self, ops: list[Op], wave: list[tuple[int, bytes, Step]]) -> list[tuple[Item, list[int]]]:
        """The wave's steps as script calls: one ``batch`` per directory hash (and per
        BATCH_STEPS steps), each with its answers' layout: the index (in ``wave``) each
        answer belongs to, -1 for an announcement's. A put, create or delete is followed
        in its batch by its announcement (SPUBLISH on the directory's channel, in the slot
        of its hash): a subscriber that hears it and reads the entry again reads the new
        one. A put followed by the acquire of the same name (a create's) is one step."""
        by_key: dict[bytes, list[int]] = {}
        for w, (_i, key, step) in enumerate(wave):
            if step:
                by_key.setdefault(key, []).append(w)
        out: list[tuple[Item, list[int]]] = []
        for key, members in by_key.items():
            for start in range(0, len(members), BATCH_STEPS):
                chunk = members[start:start + BATCH_STEPS]
                argv: list[Any] = []
                layout: list[int] = []
                skip = -1
                for n, w in enumerate(chunk):
                    if w == skip:
                        continue
                    i, _key, step = wave[w]
                    nxt = chunk[n + 1] if n + 1 < len(chunk) else -1
                    if (step[0] == "put" and nxt == w + 1 and wave[nxt][2][0] == "acquire"
                            and ops[wave[nxt][0]].path == ops[i].path):
                        acq = wave[nxt][2]
                        argv += ["putacq", len(step) + 1, *step[1:], acq[2], acq[3]]
                        layout += [w, nxt]
                        skip = nxt
                    else:
                        argv += [step[0], len(step) - 1, *step[1:]]
                        layout.append(w)
                    if step[0] in ("put", "create", "delete"):
                        path = ops[i].path
                        argv += ["announce", 2, keys.inval_channel(self.ns, paths.split(path)[0]), path]
                        layout.append(-1)
                out.append((Item(key, self.c.script_args("batch", key, *argv)), layout))
        return out

    def _announce(self, path_list: Iterable[bytes]) -> list[Item]:
        """SPUBLISH of each changed path on its directory's channel (keys.inval_channel),
        behind the writes in the same pipelines: a subscriber that hears it and reads the
        entry again reads the new one (the same master, after the write)."""
        out = []
        for path in path_list:
            if path == paths.ROOT:
                continue
            parent, _name = paths.split(path)
            ch = keys.inval_channel(self.ns, parent)
            out.append(Item(ch, ("SPUBLISH", ch, path), write=False))
        return out

    def _announce_now(self, path_list: Iterable[bytes]) -> None:
        """The announcement of changes made by single operations (its own round trip;
        a failure only leaves subscribers to their own refresh)."""
        items = self._announce(path_list)
        if items:
            try:
                self.c.run(items)
            except DHTError:
                pass

    def _apply_wave(self, ops: list[Op], wave: list[tuple[int, bytes, Step]], results: list[object]) -> None:
        calls = self._wave_items(ops, wave)
        if calls:
            self.c.run([it for it, _ in calls])
        replies: list[tuple[Any, bool]] = [(None, False)] * len(wave)  # (reply or error, ambiguous)
        for it, layout in calls:
            if isinstance(it.result, BaseException):
                for w in layout:
                    if w >= 0:
                        replies[w] = (it.result, it.ambiguous)
                continue
            for w, r in zip(layout, it.result, strict=True):
                if w >= 0:
                    replies[w] = (r, it.ambiguous)
        later: list[int] = []
        made: list[bytes] = []
        for w, (i, _key, step) in enumerate(wave):
            op, (r, ambiguous) = ops[i], replies[w]
            if not step:
                later.append(i)
            elif isinstance(r, BaseException):
                results[i] = r
            elif r[0] == ST_BUSY or (op.op == "delete" and r[0] == ST_ISDIR):
                later.append(i)
            elif op.op == "acquire":
                results[i] = True if r[0] == ST_OK else False if r[0] == ST_HELD else self._error(r[0], op.path)
            elif op.op == "release":
                results[i] = None  # also: missing, or the flag is another node's
            elif op.op == "create":
                results[i] = r[0] == ST_OK if r[0] in (ST_OK, ST_EXISTS) else self._error(r[0], op.path)
                if r[0] == ST_OK and op.entry().kind == "dir":
                    made.append(op.path)
            elif op.op == "put":
                if r[0] == ST_OK:
                    results[i] = int(r[1])
                    if r[2]:
                        made.append(op.path)
                else:
                    results[i] = None if r[0] == ST_CASFAIL else self._error(r[0], op.path, r)
            else:
                results[i] = r[0] == ST_OK or (r[0] == ST_NOTFOUND and ambiguous)
                if r[0] not in (ST_OK, ST_NOTFOUND, ST_CASFAIL):
                    results[i] = self._error(r[0], op.path)
        if made:
            hdrs = [Item(k, self.c.script_args("mkhdr", k, p))
                    for p, k in ((p, self._dkey(p)) for p in made)]
            self.c.run(hdrs)
            for it in hdrs:
                if isinstance(it.result, BaseException) or it.result[0] != ST_OK:
                    self._sc("mkhdr", it.key, it.args[-1])  # a rename held it: wait
        for i in later:
            results[i] = self._one(ops[i])

    def _one(self, op: Op) -> object:
        try:
            if op.op == "create":
                return self.create(op.path, op.entry())
            if op.op == "put":
                return self.put(op.path, op.entry(), op.expect_version, op.owners)
            if op.op == "acquire":
                return self.acquire_write(op.path, op.holder(), op.lease_seconds)
            if op.op == "release":
                self.release_write(op.path, op.holder())
                return None
            return self.delete(op.path, op.expect_version)
        except (OSError, ValueError) as e:
            if isinstance(e, ConnectionError):
                raise
            return e

    # -- service --------------------------------------------------------------------------

    def rename(self, src: bytes, dst: bytes, *, replace: bool = True) -> None:
        super().rename(src, dst, replace=replace)
        self._announce_now([src, dst])

    def invalidation_feed(self) -> InvalidationFeed:
        from .invalidations import InvalidationFeed

        return InvalidationFeed(self)

    def ping(self) -> bool:
        return self.c.ping()

    def close(self) -> None:
        self.c.close()

    def stats(self) -> dict[str, int]:
        """Counters of the cluster client: retries, refreshes, MOVED, busy waits, ..."""
        return dict(self.c.stats)
