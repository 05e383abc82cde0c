"""Background bulk work on native threads of their own, at a low CPU priority.

A replica pushed in the background (``--replica-mode async``) is work no request waits
for, yet moving its bytes costs CPU: in the kernel (``sendfile`` on the sender, the copy
into the page cache on the receiver), not in the interpreter.  Run in trio's shared
worker threads at the agent's priority, that work takes the cores from the writer it is
replicating.  Here it runs on dedicated threads niced to ``BACKGROUND_NICE`` (the
kernel charges a syscall's work to the thread that makes it, and a nice value is per
thread on Linux): the scheduler gives the writer, and every request the agent serves,
the CPU first, and the push takes what is left.

The trio loop only appends a job to the queue and sleeps until the job's thread wakes it
(``TrioToken.run_sync_soon``); nothing of the job runs on the loop.  A job is a blocking
callable taking a ``check`` callable as its last argument, which it calls between
bounded waits: ``check()`` raises :class:`Cancelled` once the awaiting task is
cancelled, and the task then raises trio's own Cancelled after the job has stopped (the
job's file descriptors are never used by two threads at once).
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import trio

log = logging.getLogger(__name__)

BACKGROUND_NICE = 10  # a niced thread's CPU weight is 110 against a default thread's 1024


_PR_SET_NAME = 15


def background_thread(name: str, nice: int | None) -> None:
    """(in the thread) Name the calling native thread (``comm``, as ``top -H`` and ``ps -L``
    show it: the first 15 bytes) and lower its priority to nice ``nice`` (Linux: one per
    thread; never raised: an agent started at a higher nice value keeps it; None: the one
    it inherited)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass  # (not Linux) unnamed
    if nice is None:
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
    except OSError as e:  # (not Linux: the whole process would be niced) still works, at full priority
        log.warning("%s: cannot lower the thread's priority: %s", name, e)


class Cancelled(Exception):
    """(in the job's thread) the task awaiting the job was cancelled: stop."""


class _Job:
    __slots__ = ("fn", "args", "token", "task", "cancelled", "value", "error")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.token = trio.lowlevel.current_trio_token()
        self.task = trio.lowlevel.current_task()
        self.cancelled = False
        self.value: Any = None
        self.error: BaseException | None = None

    def check(self) -> None:
        if self.cancelled:
            raise Cancelled()


class BackgroundThreads:
    """``count`` native threads at nice ``nice``, started on the first job and kept
    (daemon threads: they hold no state a process exit must flush)."""

    def __init__(self, name: str, count: int = 2, nice: int = BACKGROUND_NICE) -> None:
        self.name = name
        self.count = count
        self.nice = nice
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.jobs = 0

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args, check)`` on one of the threads; its result (or exception)."""
        job = _Job(fn, args)
        self._start()
        self.jobs += 1

        def abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
            job.cancelled = True  # the job stops at its next check(); it wakes us then
            return trio.lowlevel.Abort.FAILED

        self._queue.put(job)
        await trio.lowlevel.wait_task_rescheduled(abort)
        if job.cancelled:
            await trio.lowlevel.checkpoint()  # (the scope is cancelled: raises trio.Cancelled)
        if job.error is not None:
            raise job.error
        return job.value

    def _start(self) -> None:
        while len(self.threads) < self.count:
            t = threading.Thread(target=self._serve, name=f"{self.name}-{len(self.threads)}", daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self) -> None:
        background_thread(threading.current_thread().name, self.nice)
        while True:
            job = self._queue.get()
            try:
                job.value = job.fn(*job.args, job.check)
            except BaseException as e:
                job.error = e
            try:
                job.token.run_sync_soon(trio.lowlevel.reschedule, job.task)
            except trio.RunFinishedError:
                pass
