"""When the namespace's recorded changes are committed in the background: at once, within
COMMIT_SHORTLY_SECONDS (riding on the next operations' commit), or by the periodic
flush of what rides on no other commit (times, heat)."""

from __future__ import annotations

import trio

from hycache_agent.fs.files import Files

# A change that only other nodes wait for (a size at close, in a cluster), or a name the
# redo log keeps safe meanwhile, is committed this soon, with whatever else is recorded
# until then: one flusher round, one transaction, one outbox batch and one lane callback
# per this many seconds of a stream of creates or removes.
COMMIT_SHORTLY_SECONDS = 0.02
FLUSH_SECONDS = 1.0


class Commits:
    def __init__(self, files: Files) -> None:
        self.files = files
        self.serving = False  # (before the event loop serves, the next sync takes it)
        self._shortly = trio.Event()

    def run(self, nursery: trio.Nursery) -> None:
        """Serve: background commits from now on, and the periodic flush."""
        self.serving = True
        nursery.start_soon(self._flusher)

    async def _flusher(self) -> None:
        while True:
            with trio.move_on_after(FLUSH_SECONDS):  # what rides on no other commit (times, heat)
                await self._shortly.wait()
            if self._shortly.is_set():
                self._shortly = trio.Event()
                await trio.sleep(COMMIT_SHORTLY_SECONDS)
            self.files.ns.journal.commit_soon()

    def stop(self) -> None:
        self.serving = False

    def commit_shortly(self) -> None:
        """Commit what is recorded within COMMIT_SHORTLY_SECONDS: with a stream of
        operations it rides on the next one's commit."""
        self._shortly.set()

    def commit_soon(self) -> None:
        """Commit what is recorded so far in the background: the caller answers the kernel
        at once, and the commit overlaps with the application's next steps.  Names made
        this way are durable within a commit's time; a writer's close waits for its file's
        name (TieringEngine.flush), fsync and fsyncdir for everything."""
        if not self.serving:
            return
        journal = self.files.ns.journal
        if journal.logged_so_far():
            # the names are safe in the redo log already: commit within
            # COMMIT_SHORTLY_SECONDS, with the next operations' changes (one transaction,
            # one hand-off to the journal's thread and one outbox batch for a burst of
            # creates or removes, instead of one each)
            self.commit_shortly()
        else:
            journal.commit_soon()
