"""The redo log: name changes kept safe from a crash of the agent before their group commit.

A writer's close must not return before the file's name would survive a SIGKILL of the
agent.  The group commit to SQLite (``metastore.MetaJournal``) takes a thread hand-off
and the batch after the one in flight; this log takes a store into memory.  Every name
change of the namespace (create, mkdir, mknod, symlink, link, unlink, rmdir, rename) is
appended here on the event loop thread as it happens, before the kernel gets its answer:

* the file is mapped ``MAP_SHARED``: a store into a mapped page is in the kernel's page
  cache at once, so it survives the death of the process (SIGKILL) exactly as a
  ``write(2)`` would — no system call, no thread hop;
* every commit records the sequence number of the last record it covers (the counter
  ``redo_upto`` in the same transaction): the *checkpoint*;
* at start-up the records past the checkpoint are replayed on the loaded namespace (in
  order, idempotently: a record whose effect is already there is skipped) and committed;
  then the log starts over.  A file's size is not logged: recovery takes it from the blob.

Write faults: every page is faulted in writable at start (``MADV_POPULATE_WRITE``), but
once the kernel has written a page back it is write-protected again, and the next store
into it faults (ext4's ``page_mkwrite``: a journal handle, the file's mtime) — on the
event loop thread, holding the GIL, one fault per ~40 records, ~7 % of the loop's GIL
time during creates in a py-spy profile.  So the committer's thread makes the next
PREFAULT_BYTES ahead of the writer writable again after every commit
(:meth:`RedoLog.prefault`, ``madvise`` through ctypes, which releases the GIL).

What it does not give: survival of a power failure.  The mapped pages reach the disk when
the kernel writes them back, like SQLite's WAL with ``synchronous=NORMAL``; ``fsync`` and
``fsyncdir`` still wait for a commit that forces the WAL to disk, as before.

Shared with the FUSE reader: with the patched pyfuse3's answer table on, the reader answers
some UNLINKs itself (``hycache_answers.h``) and logs them in this ring before it replies.
:meth:`RedoLog.share` hands the log's writing to it then: every record, the agent's own
too, is appended by the reader's code (``pyfuse3.answers_redo_append``), and the write
position lives there, so the two never overwrite each other and the sequence numbers stay
one series in the order the changes happened.  The reader logs only while the journal
says nothing unlogged is waiting for its commit (``MetaJournal`` opens and closes it).

Layout: a 64-byte header (magic), then records ``[length u32][crc32 u32][seq u64][payload]``,
each followed by a zero length (the end mark) that the next record overwrites.  A record is
written end mark first, payload next, header last, so a record torn by a crash fails its
checksum (or is not there) and ends the scan; sequence numbers run without gaps.  The log is
a ring: when the next record does not fit before the end of the file it starts again at the
front, but only once every record in it is checkpointed; until then :meth:`RedoLog.append`
refuses (the caller waits for the commit instead, as without the log).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAGIC = b"HCREDO01"
START = 64  # records begin here (the header is the magic)
DEFAULT_SIZE = 8 << 20  # ~50,000 creates of 100-byte names between two checkpoints
_HDR = struct.Struct("<IIQ")  # payload length, crc32 of (seq, payload), seq
_SEQ = struct.Struct("<Q")
_END = b"\0\0\0\0"
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14
PREFAULT_BYTES = 256 << 10  # made writable ahead of the writer by prefault (~2,500 records)
_PAGE = mmap.PAGESIZE
try:  # a CDLL call releases the GIL while the kernel faults the pages in
    _madvise_fn = ctypes.CDLL(None, use_errno=True).madvise
    _madvise_fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _madvise_fn.restype = ctypes.c_int
    _madvise: Callable[[int, int, int], int] | None = _madvise_fn
except (OSError, AttributeError):  # pragma: no cover - not glibc/musl
    _madvise = None

# operations (the first byte of a payload)
CREATE, LINK, UNLINK, RENAME = b"c", b"l", b"u", b"r"
_CREATE = struct.Struct("<QQIIIQqH")  # parent, ino, mode, uid, gid, rdev, time_ns, len(name)
_LINK = struct.Struct("<QQH")  # ino, parent, len(name)
_UNLINK = struct.Struct("<QBH")  # parent, rmdir, len(name)
_RENAME = struct.Struct("<QQIHH")  # old parent, new parent, flags, len(old), len(new)
_NONE = 0xFFFF  # an absent optional string (symlink target, tier)


def _opt(value: bytes | None) -> bytes:
    return struct.pack("<H", _NONE) if value is None else struct.pack("<H", len(value)) + value


def _take_opt(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    (n,) = struct.unpack_from("<H", buf, pos)
    pos += 2
    if n == _NONE:
        return None, pos
    return bytes(buf[pos:pos + n]), pos + n


def create(parent: int, name: bytes, ino: int, mode: int, uid: int, gid: int, rdev: int,
           target: bytes | None, tier: str | None, time_ns: int) -> bytes:
    return (CREATE + _CREATE.pack(parent, ino, mode, uid, gid, rdev, time_ns, len(name)) + name
            + _opt(target) + _opt(tier.encode() if tier is not None else None))


def link(ino: int, parent: int, name: bytes) -> bytes:
    return LINK + _LINK.pack(ino, parent, len(name)) + name


def unlink(parent: int, name: bytes, rmdir: bool) -> bytes:
    return UNLINK + _UNLINK.pack(parent, int(rmdir), len(name)) + name


def rename(old_parent: int, old_name: bytes, new_parent: int, new_name: bytes, flags: int) -> bytes:
    return RENAME + _RENAME.pack(old_parent, new_parent, flags, len(old_name), len(new_name)) + old_name + new_name


def decode(payload: bytes) -> tuple:
    """A record's payload as ``(op, fields...)``: ``("create", parent, name, ino, mode,
    uid, gid, rdev, target, tier, time_ns)``, ``("link", ino, parent, name)``,
    ``("unlink", parent, name, rmdir)``, ``("rename", old_parent, old_name, new_parent,
    new_name, flags)``."""
    op, pos = payload[:1], 1
    if op == CREATE:
        parent, ino, mode, uid, gid, rdev, time_ns, n = _CREATE.unpack_from(payload, pos)
        pos += _CREATE.size
        name = bytes(payload[pos:pos + n])
        target, pos = _take_opt(payload, pos + n)
        tier, pos = _take_opt(payload, pos)
        return ("create", parent, name, ino, mode, uid, gid, rdev, target,
                tier.decode() if tier is not None else None, time_ns)
    if op == LINK:
        ino, parent, n = _LINK.unpack_from(payload, pos)
        pos += _LINK.size
        return ("link", ino, parent, bytes(payload[pos:pos + n]))
    if op == UNLINK:
        parent, rmdir, n = _UNLINK.unpack_from(payload, pos)
        pos += _UNLINK.size
        return ("unlink", parent, bytes(payload[pos:pos + n]), bool(rmdir))
    if op == RENAME:
        old_parent, new_parent, flags, n_old, n_new = _RENAME.unpack_from(payload, pos)
        pos += _RENAME.size
        old_name = bytes(payload[pos:pos + n_old])
        new_name = bytes(payload[pos + n_old:pos + n_old + n_new])
        return ("rename", old_parent, old_name, new_parent, new_name, flags)
    raise ValueError(f"unknown redo record {op!r}")


class _Position:
    """One of :class:`RedoLog`'s positions (``pos``, ``last_seq``, ``checkpoint``): the
    reader's while the log is shared with it (``pyfuse3.answers_redo_state`` field
    ``index``), else the log's own ``_<name>``; set in both."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, log: RedoLog | None, owner: type | None = None) -> Any:
        if log is None:
            return self
        if log._shared is not None:
            return log._shared.answers_redo_state()[self.index]
        return getattr(log, "_" + self.name)

    def __set__(self, log: RedoLog, value: int) -> None:
        if log._shared is not None:
            log._shared.answers_redo_set(**{self.name: value})
        setattr(log, "_" + self.name, value)


class RedoLog:
    """The mapped file.  ``append`` runs on the event loop thread; ``checkpoint`` is
    advanced by the committer (an int: one store, read under the GIL)."""

    def __init__(self, path: Path, size: int = DEFAULT_SIZE) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            have = os.fstat(fd).st_size
            if have < size:
                os.ftruncate(fd, size)  # (an existing shorter log keeps its records)
            self.size = max(have, size)
            self._mm = mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        try:  # fault every page in now, not one by one on the event loop thread later
            self._mm.madvise(_MADV_POPULATE_WRITE)
        except (OSError, ValueError):
            pass
        # the mapping's address: for prefault's madvise without the GIL, and for the FUSE
        # reader when the log is shared (the buffer export is dropped at once, so close()
        # stays possible; prefault and the reader stop before it)
        view = (ctypes.c_char * self.size).from_buffer(self._mm)
        self._base = ctypes.addressof(view)
        del view
        self._addr = self._base if _madvise is not None else 0
        if self._mm[:len(MAGIC)] != MAGIC:  # a new file
            self._mm[START:START + 4] = _END
            self._mm[:len(MAGIC)] = MAGIC
        self._shared: Any = None  # pyfuse3, while the reader writes the log (share)
        self._reader_may_log = False
        self._pos = START  # where the next record goes
        self._last_seq = 0  # of the last record appended (or found at start)
        self._checkpoint = 0  # every record up to this one is committed to SQLite
        self._appended = 0  # records appended since start (status)
        self._refused = 0  # appends refused: the ring was full of records not committed yet

    # -- where it stands (kept by the reader while shared: _Position) ------------------
    pos = _Position(0)  # where the next record goes
    last_seq = _Position(1)  # of the last record appended (or found at start)
    checkpoint = _Position(2)  # every record up to this one is committed to SQLite

    @property
    def appended(self) -> int:
        """Records appended since start (status)."""
        return self._appended + (self._shared.answers_redo_state()[3] if self._shared is not None else 0)

    @property
    def refused(self) -> int:
        """Appends refused: the ring was full of records not committed yet."""
        return self._refused + (self._shared.answers_redo_state()[4] if self._shared is not None else 0)

    # -- shared with the FUSE reader ----------------------------------------------------
    def share(self) -> bool:
        """Hand the writing to the patched pyfuse3's reader (see the module's docstring):
        False if this pyfuse3 cannot."""
        try:
            import pyfuse3
        except ImportError:  # pragma: no cover - the agent always has it
            return False
        if not hasattr(pyfuse3, "answers_redo_share"):
            return False
        pyfuse3.answers_redo_share(self._base, self.size, self._pos, self._last_seq, self._checkpoint)
        self._shared = pyfuse3
        self._reader_may_log = False
        return True

    def unshare(self) -> None:
        """Take the writing back (before the log is closed)."""
        shared, self._shared = self._shared, None
        if shared is not None:
            self._pos, self._last_seq, self._checkpoint, appended, refused = shared.answers_redo_unshare()
            self._appended += appended
            self._refused += refused

    def reader_may_log(self, ok: bool) -> None:
        """(event loop thread) Whether the reader may log its own name changes now: not
        while a change the log did not take waits for its commit (``MetaJournal``)."""
        if self._shared is not None and ok != self._reader_may_log:
            self._shared.answers_redo_open(ok)
            self._reader_may_log = ok

    @property
    def shared(self) -> bool:
        return self._shared is not None

    @property
    def covered(self) -> int:
        """The last record whose change the agent's namespace has (what a commit may
        checkpoint): every record, but, while shared, not those the reader's table appended
        for answers it has not handed to the agent yet (its next drain does) nor any after
        them — a checkpoint past them would lose them to a crash before that drain."""
        if self._shared is not None and hasattr(self._shared, "answers_redo_covered"):
            return self._shared.answers_redo_covered()
        return self.last_seq

    def records(self) -> list[tuple[int, bytes]]:
        """Every record of the current lap, ``(seq, payload)`` in order, up to the end
        mark or the first torn one."""
        mm, out, pos, prev = self._mm, [], START, None
        while pos + _HDR.size <= self.size:
            n, crc, seq = _HDR.unpack_from(mm, pos)
            end = pos + _HDR.size + n
            if n == 0 or end > self.size:
                break
            payload = mm[pos + _HDR.size:end]
            if zlib.crc32(payload, zlib.crc32(_SEQ.pack(seq))) != crc:
                break  # torn by a crash while it was written
            if prev is not None and seq != prev + 1:
                break
            out.append((seq, payload))
            prev, pos = seq, end
        return out

    def pending(self, checkpoint: int) -> list[tuple[int, bytes]]:
        """The records past ``checkpoint`` (to replay at start-up); sets the log's sequence
        numbers to go on after them."""
        recs = [(seq, p) for seq, p in self.records() if seq > checkpoint]
        if recs and recs[0][0] != checkpoint + 1:
            log.error("%s: records %d..%d are missing (checkpoint %d); replaying from %d",
                      self.path, checkpoint + 1, recs[0][0] - 1, checkpoint, recs[0][0])
        self.checkpoint = checkpoint
        self.last_seq = max([checkpoint] + [seq for seq, _ in recs])
        return recs

    def append(self, payload: bytes) -> int | None:
        """(event loop thread) Append one record; its sequence number, or None when the ring
        is full of records not committed yet (the caller waits for the commit instead)."""
        if self._shared is not None:
            return self._shared.answers_redo_append(payload) or None
        n = len(payload)
        need = _HDR.size + n
        p = self._pos
        if p + need + 4 > self.size:
            if self._checkpoint < self._last_seq or START + need + 4 > self.size:
                self._refused += 1
                return None
            p = START  # every record in the ring is committed: start again at the front
        seq = self._last_seq + 1
        mm = self._mm
        mm[p + need:p + need + 4] = _END
        mm[p + _HDR.size:p + need] = payload
        mm[p:p + _HDR.size] = _HDR.pack(n, zlib.crc32(payload, zlib.crc32(_SEQ.pack(seq))), seq)
        self._pos = p + need
        self._last_seq = seq
        self._appended += 1
        return seq

    def prefault(self) -> bool:
        """(a worker thread: the committer's, after a commit) Make the PREFAULT_BYTES after
        the write position writable again where the kernel's write-back write-protected
        them (the ring's front too when the end is near), so that the loop thread's next
        appends do not fault.  Only a hint: the appends are correct either way.  False if
        it could not (no madvise, or MADV_POPULATE_WRITE unsupported: not tried again)."""
        addr = self._addr
        if not addr or _madvise is None:  # (an address is taken only where madvise is)
            return False
        start = self.pos & ~(_PAGE - 1)
        ranges = [(start, min(self.size, start + PREFAULT_BYTES))]
        if start + PREFAULT_BYTES > self.size:  # the ring starts over soon
            ranges.append((0, min(start, start + PREFAULT_BYTES - self.size)))
        try:
            for lo, hi in ranges:
                if hi > lo and _madvise(addr + lo, hi - lo, _MADV_POPULATE_WRITE) != 0:
                    if ctypes.get_errno() in (22, 95):  # EINVAL / EOPNOTSUPP: an older kernel
                        self._addr = 0
                    return False
        except Exception:
            log.debug("redo log: prefault failed", exc_info=True)
            return False
        return True

    def reset(self) -> None:
        """Start again at the front (every record is committed: after the replay's commit)."""
        self._mm[START:START + 4] = _END
        self.pos = START
        self.checkpoint = self.last_seq

    def close(self) -> None:
        self.unshare()
        self._addr = 0  # (the committer is stopped before: no prefault runs now)
        self._mm.close()
