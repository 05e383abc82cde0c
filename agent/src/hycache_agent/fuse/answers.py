"""The answer table: what the patched pyfuse3's request reader answers in C, before a
request reaches Python (``pyfuse3.answers_*``, agent/patches: ``hycache_answers.h``).

A GETATTR, a LOOKUP of a name, or a GETXATTR of ``security.capability`` of a local inode
costs the loop thread ~20–30 µs through pyfuse3 and trio, of which the agent's own answer
is ~1 µs (docs/benchmarks.md).  The reader answers those from this table instead: the read,
a lookup in a C hash table and the ``writev`` of the reply.  So is the LOOKUP of a name a
directory does not have — the one before every create — once the agent told the table
that it has all of the directory's names (:meth:`AnswerTable.missing`).

What goes in is exactly what the agent would answer right now, and only for inodes whose
attributes nothing can change without the agent seeing it first: local inodes (not another
node's file, not a name taken over) with no open handle and no registered backing (while a
file is open the kernel writes its blob itself and the blob is the truth for its size).
What goes out:

- the reader drops what every request it hands on may change (its inode's attributes; for
  the requests that make, remove or rename names, the names, their directories' attributes
  and the attributes of the inodes they named) before the agent sees the request;
- the agent drops what it changes by itself, through the metadata journal's watcher
  (every change of an inode, a name or an extended attribute is recorded there:
  ``MetaJournal.watcher``), and what another node changes (``invalidate_entry``);
- what the agent offers is what it knew at its last drain, so the table refuses the
  attributes of a file an open for writing it answered since holds (passthrough22: the
  kernel writes the blob meanwhile), and, until the next drain, of a file whose
  registration the agent took back while opens answered with it were outstanding.

Names are kept as the journal records them: every name the agent makes or removes is put
in or taken out as it happens (a request that removes a name only drops the attributes it
may change; the name goes when the agent removed it).  A directory marked complete has all
its names in the table, so "no such name" is the table's answer for the others: standalone
until the table loses names (emptied when full); in a cluster, where other nodes' names are
in the directory's cached listing (kept as names the agent answers itself), only while that
listing answers every lookup (META_TTL_SECONDS; no remote node learnt since), and the
lookups answered are counted as the listing's (how often a directory is listed depends on it).

A LOOKUP answered by the table is one more reference of the kernel's to the inode: the
reader hands the counts over (:meth:`AnswerTable.drained`) before anything else runs on
the agent's side, so FORGET and ``maybe_free`` always see every reference.

Opens (``--no-answer-opens`` turns this off): a closed fast-tier file keeps its
passthrough registration (``Backings.parked``), and the agent lends it to the table
(``Backings.lender``: :meth:`AnswerTable.lend`), which then answers a read-only OPEN of the
file (no O_TRUNC, no O_DIRECT) with it — file handle ``LENT_FH | ino``, the kernel reads
the blob itself — and the RELEASE of such an open.  They are handed over with the same
drain, before anything else runs, and counted as the agent's own opens then
(``Opens.lent_opened``: the registration in use, the inode open, an access for the
policy), so the agent's view of who holds the file is the same as if it had answered
them.  It takes a registration back (:meth:`AnswerTable.take_back`) before the
registration goes anywhere else (dropped, recycled, moved with a migration, or given to
an open the agent answers); the RELEASEs of lent opens still open then come to the agent.
A reader changes no attribute, so the table keeps answering GETATTR meanwhile.

Removals (passthrough14): the UNLINK of a closed regular file's name is answered by the
reader too, where the agent marked the file removable when it offered its attributes
(``Names.removable_by_reader``: its removal needs nothing but the name's — in a cluster no
replica to tell) and the journal shares its redo log with the reader
(``MetaJournal.share_redo``): the reader logs the removal in the same ring before it
replies, so it survives a crash of the agent as the agent's own do, sets the directory's
times, and hands the removal over with the same drain; the agent then removes the name from
its namespace as it would have (:meth:`AnswerTable.removed`: ``Names.removed_by_reader``),
and the file is freed when the kernel forgets it, as before.

Creates (passthrough15): the open of a create the agent answers is a lent writer's when
the new file's writers may be lent (``Backings.lend_created``): the reader answers its
RELEASE.  Further, the reader answers a CREATE itself in a complete directory the agent
marked for it (``creates``, with the directory's attributes) while it holds pool blobs the
agent gave it (``BlobPool.give``: empty fast-tier blobs, open and registered, kept stocked
at each drain, :meth:`AnswerTable.restock`): it logs the create in the shared redo log,
puts the name in, lends the registration for writers with the create's open counted and
replies; the agent makes the file its own at the drain (``Opens.created_by_reader``), in
order with the reader's removals.  Where creates may not be lent (a replica to push at
close, the fast tier over its high watermark: ``Backings.tier_filling`` takes the blobs
back), the stock runs out and the CREATEs come to the agent.

Opens for writing (not truncating) are answered the same way where they need nothing of
the agent at open or close (``Backings._lends_to_writers``: no set-ID bits, the name safe
from a crash, the fast tier below its high watermark; in a cluster, no replica to push at
close and the file's write lease held and reusable: ``WriteLeases.lendable``, which tells
``Backings.readers_only`` when that may have stopped).  Such an OPEN drops the inode's
attributes from the table (the blob is the truth for its size from then on); the drained
writers put the lease in use (``WriteLeases.lent_writers``, renewed with the others) and
make the agent look at the blob at the last release, as for its own writers; a writer's
handle carries ``LENT_WRITER``, so that its release ends its use of the lease.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pyfuse3

from hycache_agent.fs import tiers as T
from hycache_agent.fs.namespace import FsError, Inode
from hycache_agent.vfs.layer import Vfs

log = logging.getLogger(__name__)

CAPS = b"security.capability"
# A directory with more names is not marked complete (the table keeps 24,576 names; filling
# it with one directory would empty it for every other)
COMPLETE_MAX = 4096
AVAILABLE = hasattr(pyfuse3, "answers_complete")  # the patched pyfuse3, passthrough9 and later
OPENS = hasattr(pyfuse3, "answers_lend")  # passthrough11 and later
LENT_FH: int = getattr(pyfuse3, "ANSWERS_LENT_FH", 0)  # the handles of the opens the table answers
WRITERS = hasattr(pyfuse3, "ANSWERS_LENT_WRITER")  # passthrough13 and later: opens for writing too
REMOVALS = hasattr(pyfuse3, "answers_redo_share")  # passthrough14 and later: UNLINKs too
CREATES = hasattr(pyfuse3, "answers_lend_opened")  # passthrough15 and later: a create's open lent
LENT_WRITER: int = getattr(pyfuse3, "ANSWERS_LENT_WRITER", 0)  # (and a writer's handle has this too)
LENT_INO = ~(LENT_FH | LENT_WRITER)  # the inode of a lent open's handle
# passthrough20 and later: a file opened for writing through a lent registration has its
# attributes answered again at the last lent release (the table fstat()s the blob by the
# agent's descriptor, given with the registration), and a created file's are then removable
RESTORES = hasattr(pyfuse3, "ANSWERS_RESTORES")
# pool blobs the reader holds for its CREATEs (topped up at half, at each drain): as many as
# its table takes (HC_POOL_MAX). With 256, mdtest's 4 ranks emptied it between two drains of a
# busy event loop and 1-2 % of their CREATEs waited for the loop, milliseconds each
CREATE_STOCK = 1024


class AnswerTable:
    """The agent's side of the table: what it puts in and drops, and the counts it is
    handed back."""

    def __init__(self, vfs: Vfs, enabled: bool) -> None:
        self.vfs = vfs
        self.ns = vfs.ns
        self.io = vfs.engine.io
        self.enabled = enabled and AVAILABLE
        self.names = vfs.names
        self.cluster = vfs.names.cluster is not None
        self.opens = self.enabled and OPENS and vfs.engine.config.answer_opens
        self.removals = False  # the reader answers UNLINKs (start: the redo log shared)
        self.creates = False  # ... and CREATEs (start: removals, passthrough15, opens lent)
        # directories whose attributes the table keeps while the agent makes a drain's
        # creates and removals its own (:meth:`keeping`): the table changed their times
        # itself, and the agent offers its own once it is done
        self._keep: frozenset[int] = frozenset()
        self._kept: set[int] = set()  # of them, those whose drop was held back

    def start(self, local_timeout: float) -> None:
        """Before the session runs: turn the table on (or make sure it is off) and watch
        the journal for the agent's own changes.  ``local_timeout``: how long the kernel
        keeps a local inode's attributes and names (what a CREATE the table answers says)."""
        if not AVAILABLE:
            return
        pyfuse3.answers_enable(self.enabled)
        if self.enabled:
            self.ns.journal.watcher = self
            self.names.watch_listings(self.listing_changed)
            self.removals = REMOVALS and self.ns.journal.share_redo()
        if self.opens:  # parked registrations are lent to the table (Backings.lender)
            self.vfs.backings.lender = self
            if CREATES and self.removals and WRITERS:  # so are new files, for CREATEs
                self.creates = True
                if RESTORES:  # (Names.removable_by_reader of a new file: regular, no replicas)
                    pyfuse3.answers_creates(local_timeout, local_timeout, T.FAST.encode(), removable=True)
                else:
                    pyfuse3.answers_creates(local_timeout, local_timeout, T.FAST.encode())
                self.vfs.backings.creates_lent = self.vfs.opens.lends_creates
                self.vfs.engine.blobs.on_refilled = self.restock  # (and at every drain)
            if WRITERS:  # opens for writing too, where they need nothing of the agent
                backings = self.vfs.backings
                backings.writers_lent = self.vfs.opens.lends_writers
                if self.vfs.opens.own is not None:  # told when a file's write lease may not be lent
                    self.vfs.opens.own.write.unlendable = backings.readers_only

    # -- what goes in -------------------------------------------------------------------
    def offer(self, inode: Inode, attrs: pyfuse3.EntryAttributes, parent: int = 0,
              name: bytes | None = None) -> None:
        """The agent answers ``attrs`` for ``inode`` (and, with ``parent`` and ``name``, a
        LOOKUP of that name with it): the table answers the same from now on, if it may.

        The name is kept for any local inode (the table answers a LOOKUP only while it
        also has the inode's attributes); the attributes only while nothing can change
        them without the agent seeing a request for the inode first, or changing them
        itself: no open handle, no registered backing."""
        if not self.enabled:
            return
        ino = inode.ino
        if self.ns.inodes.get(ino) is not inode or self.vfs.view.remote(ino) is not None:
            return
        if name is not None:
            pyfuse3.answers_put_name(parent, name, ino)
        if inode.nlink > 0 and inode.open_count == 0 and ino not in self.vfs.backings.by_ino:
            self._kept.discard(ino)  # (replaced: nothing to drop after a drain, :meth:`keeping`)
            if self.removals and self.names.removable_by_reader(inode):
                pyfuse3.answers_put(attrs, removable=True)
            elif self.creates and inode.is_dir:
                pyfuse3.answers_put(attrs, creates=True)
            else:
                pyfuse3.answers_put(attrs)

    def no_caps(self, inode: Inode) -> None:
        """``inode`` has no security.capability attribute (the kernel asks once per inode
        before its first write)."""
        if self.enabled and CAPS not in inode.xattrs:
            pyfuse3.answers_put_no_caps(inode.ino)

    def missing(self, parent: int) -> None:
        """The agent answered "no such name" in directory ``parent``: from now on the
        table answers that for every name ``parent`` does not have, if the agent can say
        which names it has (``Names.complete_names``)."""
        if not self.enabled:
            return
        found = self.names.complete_names(parent, COMPLETE_MAX)
        if found is None:
            return
        pyfuse3.answers_complete(parent, *found)

    def count_misses(self, parent: int) -> None:
        """Before the agent looks up a name in ``parent``: the lookups the table answered
        there with "no such name" count as the agent's own (a cluster's listings)."""
        if self.cluster and self.enabled:
            n = pyfuse3.answers_take_misses(parent)
            if n:
                self.names.count_lookups(parent, n)

    def listing_changed(self, dirpath: bytes) -> None:
        """(the global view) Names of ``dirpath`` may be missing from its listing: the
        table no longer answers "no such name" there (a local directory's; a directory
        only other nodes hold is never complete)."""
        try:
            ino = self.ns.resolve(dirpath).ino
        except FsError:
            return
        pyfuse3.answers_incomplete(ino)

    # -- what goes out: MetaJournal.watcher -----------------------------------------------
    @contextlib.contextmanager
    def keeping(self, dirs: frozenset[int]) -> Iterator[None]:
        """While the agent makes the table's creates and removals in ``dirs`` its own: the
        journal's changes of those directories do not drop their attributes from the table
        (it set their times itself at each change; dropped, every UNLINK or CREATE in them
        the kernel sends meanwhile would go to the agent, until it offers them again).
        The caller offers their attributes once done (:meth:`offer` replaces them); those
        whose drop was held back and that it did not offer are dropped on the way out."""
        self._keep, self._kept = dirs, set()
        try:
            yield
        finally:
            kept, self._keep, self._kept = self._kept, frozenset(), set()
            for ino in kept:
                pyfuse3.answers_drop(ino)

    def inode(self, ino: int) -> None:
        if ino in self._keep:
            self._kept.add(ino)
            return
        pyfuse3.answers_drop(ino)
        if ino in self.vfs.backings.lent_writable:  # (made set-ID: its writers go to the agent)
            self.vfs.backings.writers_recheck(self.ns.inodes.get(ino), ino)

    def link(self, parent: int, name: bytes, ino: int) -> None:
        pyfuse3.answers_link(parent, name, ino)

    def unlink(self, parent: int, name: bytes) -> None:
        pyfuse3.answers_drop_name(parent, name, complete=False)

    def xattr(self, ino: int) -> None:
        pyfuse3.answers_drop(ino, attrs=True, caps=True)

    # -- registrations lent: Backings.lender -------------------------------------------
    def lend(self, ino: int, backing_id: int, writable: bool, fd: int, opened: int = 0) -> bool:
        """(``opened``: opens the agent answered with it itself, a create's: passthrough15;
        ``fd``: the agent's descriptor of the blob, open until :meth:`take_back`)"""
        if opened:
            return (CREATES and self._lend(ino, backing_id, writable, fd)
                    and bool(pyfuse3.answers_lend_opened(ino, opened)))
        if WRITERS:
            return self._lend(ino, backing_id, writable, fd)
        return not writable and bool(pyfuse3.answers_lend(ino, backing_id))

    @staticmethod
    def _lend(ino: int, backing_id: int, writable: bool, fd: int) -> bool:
        if RESTORES:
            return bool(pyfuse3.answers_lend(ino, backing_id, writable, fd))
        return bool(pyfuse3.answers_lend(ino, backing_id, writable))

    def take_back(self, ino: int) -> None:
        pyfuse3.answers_unlend(ino)

    def give(self, ino: int, backing_id: int, fd: int) -> bool:
        if RESTORES:
            return bool(pyfuse3.answers_pool_put(ino, backing_id, fd))
        return bool(pyfuse3.answers_pool_put(ino, backing_id))

    def take_given(self) -> list[int]:
        return [ino for ino, _ in pyfuse3.answers_pool_take()]

    def restock(self) -> None:
        """(at each drain) Pool blobs for the CREATEs the reader answers: topped up to
        CREATE_STOCK once fewer than half are left."""
        if self.creates:
            have = pyfuse3.answers_pool_size()
            if have < CREATE_STOCK // 2:
                self.vfs.backings.stock_creates(CREATE_STOCK, have)

    # -- what comes back ----------------------------------------------------------------
    def created(self, parent: int, name: bytes, ino: int, t: int, mode: int, uid: int, gid: int,
                flags: int) -> Inode | None:
        """The reader answered a CREATE of ``name`` in ``parent`` with inode ``ino`` (a
        pool blob it was given) at ``t`` and logged it: the agent makes the file as it
        would have.  None (logged as an error) if its namespace disagrees, which the
        table's rules exclude."""
        # The table made the name, the directory's times and the file's attributes (kept
        # aside until the create's open is released: RESTORES) itself: the journal's records
        # of the same changes must not drop them (the agent's inode says what they say).
        journal = self.ns.journal
        watcher = journal.watcher
        if RESTORES:
            journal.watcher = None
        try:
            return self.vfs.opens.created_by_reader(parent, name, ino, mode, uid, gid, t, flags)
        except (FsError, KeyError) as exc:
            log.error("answer table: a create of %r in %d the agent cannot repeat: %r", name, parent, exc)
            return None
        finally:
            journal.watcher = watcher

    def removed(self, parent: int, name: bytes, ino: int, t: int) -> bool:
        """The reader answered an UNLINK of ``name`` in ``parent`` (naming ``ino``) at
        ``t`` and logged it: the agent removes the name as it would have.  False (logged
        as an error) if the agent's namespace disagrees, which the table's rules exclude."""
        try:
            node = self.names.removed_by_reader(parent, name, t)
        except FsError as exc:
            log.error("answer table: an unlink of %r in %d the agent cannot repeat: %s", name, parent, exc)
            return False
        if node.ino != ino:
            log.error("answer table: %r in %d named inode %d, the table had %d", name, parent, node.ino, ino)
        return True

    def drained(self, lookups: list[tuple[int, int]], answered: int) -> dict[int, int]:
        """The reader answered ``answered`` requests since the last call, among them
        LOOKUPs of ``lookups`` (inode, count): the kernel's references.  Those of inodes
        the agent does not have yet are returned (ino -> count): files the table created
        since the last drain (with RESTORES their names are answered once the create's open
        is released), counted when the drain makes them (:meth:`unknown_lookups` for the rest)."""
        self.io.metadata_ops += answered
        inodes = self.ns.inodes
        unknown: dict[int, int] = {}
        for ino, n in lookups:
            node = inodes.get(ino)
            if node is None:
                unknown[ino] = unknown.get(ino, 0) + n
                continue
            node.lookups += n
        return unknown

    @staticmethod
    def unknown_lookups(unknown: dict[int, int]) -> None:
        """LOOKUPs the table answered of inodes neither the agent had nor the drain made:
        cannot happen (the table holds a name only while the agent has its inode, or after
        it created the file itself)."""
        for ino, n in unknown.items():
            log.error("answer table: %d lookups of inode %d, which is gone", n, ino)
