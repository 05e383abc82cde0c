"""A lane: one dedicated worker thread for short blocking jobs, run in order, whose results
come back to the trio thread without waking it for each one.

``trio.to_thread.run_sync`` costs a thread hand-off, a wake-up of the event loop and a
task switch per call, which is most of a small metadata operation's cost.  Jobs whose
caller does not need to wait for them (the metadata commit of a create, dropping a
backing file at release) go through a lane instead: ``submit`` queues the job and returns
at once; the worker runs jobs in submission order; their ``then`` callbacks run on the trio
thread when the lane is *drained*: every ``DRAIN_SECONDS`` while jobs are outstanding, and
at once while somebody waits (:meth:`Lane.watching`).

The jobs themselves are handed over the same way: what is submitted while nobody waits is
held and given to the worker as one batch when the drainer runs (at once after a quiet
spell, then once every ``DRAIN_SECONDS`` while jobs keep coming), so a burst of removes or
releases wakes the worker thread once, not once a job.  Each wake-up of that thread is a
futex wake and, beside the busy loop thread, a hand-over of the GIL that the next request
waits for (the kernel's wait for a LOOKUP in a run of removes: 33 µs p50 with a wake-up a
job, 16 µs with batches; docs/benchmarks.md).  A job somebody waits for
(:meth:`Lane.watching`) goes at once, and takes what is held with it; so does every job
of a lane made with ``hold=False`` (the journal's: each of its jobs is a group commit
already, and holding it a round made the commits of a burst few and large).

Nothing here blocks the event loop: ``submit`` is a list append or a ``SimpleQueue.put``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from hycache_agent.transport.idle import background_thread

log = logging.getLogger(__name__)

DRAIN_SECONDS = 0.02

_STOP = object()


class Lane:
    def __init__(self, name: str, *, hold: bool = True, nice: int = 0) -> None:
        """``hold``: jobs nobody waits for wait for the drainer's next round and go together
        (a lane with a job per operation); False: each goes at once (a lane whose jobs are
        already batched, as the journal's group commits, which must not wait a round more).
        ``nice``: the worker thread's nice value (0: the agent's)."""
        self.name = name
        self.hold = hold
        self.nice = nice
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: deque[tuple[Callable | None, Any, BaseException | None]] = deque()
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._outstanding = 0  # submitted, callbacks not run yet (trio thread)
        self._held: list[tuple[Callable, tuple, Callable | None]] = []  # not handed over yet
        self.batches = 0  # hand-overs to the worker (each wakes its thread at most once)
        self._watchers = 0  # tasks waiting for a callback (read by the worker)
        self._wake_pending = False
        self._work = trio.Event()  # set by submit: the drainer has something to drain
        self._progress: trio.Event | None = None  # set by the next drain (a task waits for the backlog)
        self.closing = False

    # -- trio thread ----------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], *args: Any, then: Callable[[Any, BaseException | None], None] | None = None) -> None:
        """Run ``fn(*args)`` on the lane's thread; then ``then(result, error)`` on the trio thread."""
        if self._thread is None:
            self._token = trio.lowlevel.current_trio_token()
            self._thread = threading.Thread(target=self._run, name=f"hycache-{self.name}", daemon=True)
            self._thread.start()
        self._outstanding += 1
        self._held.append((fn, args, then))
        if self._watchers or not self.hold:  # at once, with anything held before it (in order)
            self._hand_over()
        self._work.set()

    def _hand_over(self) -> None:
        """The held jobs to the worker, as one batch (one wake-up of its thread)."""
        if self._held:
            held, self._held = self._held, []
            self.batches += 1
            self._jobs.put(held)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """(any thread) Run ``fn(*args)`` on the trio thread soon."""
        if self._token is None:  # (set by the first submit, which starts the thread)
            raise RuntimeError(f"lane {self.name}: call_soon before any submit")
        try:
            self._token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:  # shutting down: nobody is waiting any more
            pass

    @property
    def running(self) -> bool:
        """Whether the worker runs (False before the first submit and once :meth:`close`
        stopped it: a callback run by close must not submit more)."""
        return self._thread is not None

    @property
    def backlog(self) -> int:
        """Jobs submitted whose callbacks have not run yet."""
        return self._outstanding

    async def wait_backlog(self, most: int) -> None:
        """Wait until at most ``most`` jobs are outstanding: back-pressure for a producer
        of jobs that each hold something until they ran (a dropped backing file holds its
        descriptor), so that a worker slower than the producer (the close of a deleted
        file's last descriptor frees its blocks, which waits for the journal on a busy
        disk) cannot let them pile up without bound."""
        while self._outstanding > most:
            with self.watching():  # each job's callback runs as soon as it is done
                if self._outstanding <= most:  # (watching drained what was done)
                    return
                if self._progress is None:
                    self._progress = trio.Event()
                await self._progress.wait()

    def drain(self) -> None:
        """Run the callbacks of the jobs done so far."""
        self._wake_pending = False
        if self._done and self._progress is not None:
            self._progress.set()
            self._progress = None
        while self._done:
            then, result, error = self._done.popleft()
            self._outstanding -= 1
            if then is not None:
                try:
                    then(result, error)
                except Exception:
                    log.exception("%s: callback failed", self.name)
            elif error is not None:
                log.error("%s: %s", self.name, error)

    @contextlib.contextmanager
    def watching(self):
        """While inside, callbacks run as soon as their jobs are done (a task waits for one)."""
        self._watchers += 1
        try:
            self._hand_over()
            if self._done:
                self.drain()
            yield
        finally:
            self._watchers -= 1

    async def drainer(self) -> None:
        """Runs for the agent's lifetime: drains every DRAIN_SECONDS while jobs are outstanding."""
        while True:
            await self._work.wait()
            self._work = trio.Event()
            while self._outstanding:
                self._hand_over()
                await trio.sleep(DRAIN_SECONDS)
                self.drain()

    def close(self) -> None:
        """(after the event loop) Stop the worker once the jobs queued so far are done, and
        run their callbacks here (they record what the jobs found, e.g. a file's final size)."""
        if self._thread is not None:
            self.closing = True
            self._hand_over()
            self._jobs.put(_STOP)
            self._thread.join()
            self._thread = None
            self.closing = False
        self.drain()

    # -- worker thread ----------------------------------------------------------------------
    def _run(self) -> None:
        background_thread(f"hycache-{self.name}", self.nice or None)
        while True:
            batch = self._jobs.get()
            if batch is _STOP:
                return
            for fn, args, then in batch:
                try:
                    result, error = fn(*args), None
                except Exception as exc:
                    result, error = None, exc
                self._done.append((then, result, error))
                if self._watchers and not self._wake_pending:
                    self._wake_pending = True
                    self.call_soon(self.drain)
