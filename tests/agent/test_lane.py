"""The lane (agent/src/hycache_agent/fs/lane.py): one worker thread for short blocking
jobs, run in order, their callbacks on the trio thread.  Jobs nobody waits for are handed
over in batches (one wake-up of the worker a drain interval); a job somebody waits for is
not held.  Real threads and a real trio loop; the drain interval is set far beyond any
test's run so that a job that was held shows as a hang, not as a slow run."""

from __future__ import annotations

import threading

import pytest
import trio
from hycache_agent.fs import lane as lane_mod
from hycache_agent.fs.lane import Lane

LONG = 600.0  # the drain interval in these tests: a held job would wait this long


@pytest.fixture
def long_drain(monkeypatch):
    monkeypatch.setattr(lane_mod, "DRAIN_SECONDS", LONG)


def test_jobs_nobody_waits_for_run_in_order_in_batches(monkeypatch) -> None:
    monkeypatch.setattr(lane_mod, "DRAIN_SECONDS", 0.01)
    ran: list[tuple[int, int]] = []
    called: list[tuple[int, BaseException | None]] = []

    def job(i: int) -> int:
        ran.append((i, threading.get_ident()))
        if i == 7:
            raise ValueError("job 7 fails")
        return i * i

    async def main() -> Lane:
        lane = Lane("test")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lane.drainer)
            for i in range(50):  # one burst, as a run of removes submits its jobs
                lane.submit(job, i, then=lambda r, e, i=i: called.append((i, e if e else r)))
            while lane.batches < 1:  # the drainer hands the burst over
                await trio.sleep(0)
            for i in range(50, 100):  # submitted while the first batch is out: the next batch
                lane.submit(job, i, then=lambda r, e, i=i: called.append((i, e if e else r)))
            with trio.fail_after(30):
                while len(called) < 100:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        return lane

    lane = trio.run(main)
    assert [i for i, _ in ran] == list(range(100))  # in submission order
    assert len({tid for _, tid in ran}) == 1 and ran[0][1] != threading.get_ident()  # one worker thread
    assert [i for i, _ in called] == list(range(100))  # callbacks in order, on the trio thread
    assert isinstance(called[7][1], ValueError) and called[8][1] == 64  # an error goes to its callback only
    assert lane.batches == 2  # each burst handed over together, not one wake-up a job
    lane.close()


def test_a_watched_job_is_not_held_until_the_next_drain(long_drain) -> None:
    results: list[int] = []

    async def main() -> None:
        lane = Lane("test")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lane.drainer)
            lane.submit(lambda: 1, then=lambda r, e: results.append(r))  # handed over, then the drainer sleeps
            while lane.batches < 1:
                await trio.sleep(0)
            lane.submit(lambda: 2, then=lambda r, e: results.append(r))  # held: nobody waits for it
            done = trio.Event()
            with trio.fail_after(30):  # (the next drain is LONG away)
                with lane.watching():  # somebody waits: what is held goes now
                    lane.submit(lambda: 3, then=lambda r, e: done.set())  # and this one at once
                    await done.wait()
            assert results == [1, 2]
            nursery.cancel_scope.cancel()
        lane.close()

    trio.run(main)


def test_close_runs_the_held_jobs_and_their_callbacks(long_drain) -> None:
    results: list[int] = []
    lane: Lane | None = None

    async def main() -> None:
        nonlocal lane
        lane = Lane("test")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lane.drainer)
            lane.submit(lambda: 1, then=lambda r, e: results.append(r))
            while lane.batches < 1:
                await trio.sleep(0)
            for i in (2, 3):
                lane.submit(lambda i=i: i, then=lambda r, e: results.append(r))  # held
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert lane is not None
    lane.close()  # at shutdown, after the event loop: the held jobs run, then their callbacks
    assert results == [1, 2, 3]


def test_a_lane_that_does_not_hold_hands_each_job_over_at_once(long_drain) -> None:
    """The journal's lane (group commits, batched already) does not wait for the drainer."""
    ran = threading.Event()

    async def main() -> None:
        lane = Lane("test", hold=False)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lane.drainer)
            lane.submit(lambda: 1)
            while lane.batches < 1:
                await trio.sleep(0)
            lane.submit(ran.set)  # the drainer sleeps LONG now: it goes anyway
            with trio.fail_after(30):
                while not ran.is_set():
                    await trio.sleep(0.01)
            assert lane.batches == 2
            nursery.cancel_scope.cancel()
        lane.close()

    trio.run(main)


def test_a_producer_waits_for_the_backlog_and_sees_it_shrink_as_jobs_finish(long_drain) -> None:
    """wait_backlog is back-pressure: the producer (a blob registration, which holds a
    descriptor until its drop job ran) waits while more than ``most`` jobs are
    outstanding, and goes on as soon as the worker's progress brings them down — not at
    the next drain (LONG away), and without the jobs being given up."""
    gates = [threading.Event() for _ in range(20)]
    finished: list[int] = []

    async def main() -> None:
        lane = Lane("test")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lane.drainer)
            for i, gate in enumerate(gates):  # a slow worker: each job waits for its gate
                lane.submit(gate.wait, then=lambda r, e, i=i: finished.append(i))
            assert lane.backlog == 20
            backlogs: list[int] = []

            async def producer() -> None:
                for _ in range(3):
                    await lane.wait_backlog(5)
                    backlogs.append(lane.backlog)
                    lane.submit(lambda: None)

            with trio.fail_after(30):
                async with trio.open_nursery() as inner:
                    inner.start_soon(producer)
                    await trio.sleep(0.2)
                    assert backlogs == []  # 20 outstanding: it waits
                    for gate in gates[:14]:
                        gate.set()
                    await trio.sleep(0.2)
                    assert backlogs == []  # 6 left: still more than 5
                    gates[14].set()  # 5 left: it goes, one submit; 6 again: waits
                    while len(backlogs) < 1:
                        await trio.sleep(0.01)
                    await trio.sleep(0.2)
                    assert backlogs == [5]
                    for gate in gates[15:]:
                        gate.set()
            assert len(backlogs) == 3 and max(backlogs) <= 5
            assert finished == list(range(20))  # every job ran, in order
            nursery.cancel_scope.cancel()
        lane.close()

    trio.run(main)
