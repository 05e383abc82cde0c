"""Plan steps of the 2-layer scheduling (issue 9), agent side: the ``prefetch`` action
through the link's answer handling with a real engine (tests/agent/harness.py); the plan
step's fields ride on its result until the control plane acknowledges it.  The remote
case (a file another node holds) is in tests/cluster/test_prefetch_remote.py."""

from __future__ import annotations

from hycache_agent.fs import tiers as T

from .harness import run_engine
from .test_control_link import answer, link_for

K = 1 << 10
M = 1 << 20


def test_prefetch_promotes_a_slow_local_file_and_reports_the_plan_step(tmp_path):
    async def body(h):
        e = h.engine
        link = link_for(e)
        d = await h.mkdir(b"in")
        ino = await h.write_file(b"x.dat", b"x" * (200 * K), parent=d)
        assert await e.move(h.ns.get(ino), T.SLOW) is None
        assert h.tier(ino) == T.SLOW
        step = {"manifest_id": 7, "job": "stage2-a", "step": 3}
        await answer(link, actions=[{"id": 40, "action": "prefetch", "path": "/in/x.dat", "size": 200 * K,
                                     "source": "local", **step}])
        assert h.tier(ino) == T.FAST  # waited for: there when the result is reported
        assert link.pending[40] == {"id": 40, "state": "done", "detail": "fast", "tier": "fast", **step}
        # the job's open is a hit on the fast tier
        hits = e.counters_dict()["fast"]["hits"]
        assert await h.read_file(ino) == b"x" * (200 * K)
        c = e.counters_dict()
        assert c["fast"]["hits"] == hits + 1 and c["misses"] == 0

        # again: nothing to do, said so
        await answer(link, actions=[{"id": 41, "action": "prefetch", "path": "/in/x.dat", **step, "step": 4}])
        assert link.pending[41]["state"] == "done" and link.pending[41]["detail"] == "already fast"
        assert link.pending[41]["step"] == 4 and link.pending[41]["job"] == "stage2-a"

        # results (with their plan fields) are re-sent until acknowledged
        hb = link.build_heartbeat(await link.agent_status())
        assert {r["id"]: r.get("manifest_id") for r in hb["action_results"]} == {40: 7, 41: 7}
        await answer(link, acked_results=[40])
        assert [r["id"] for r in link.build_heartbeat(await link.agent_status())["action_results"]] == [41]
        # an action that is not a plan step has no plan fields
        await answer(link, actions=[{"id": 42, "action": "demote", "path": "/in/x.dat"}])
        assert link.pending[42] == {"id": 42, "state": "done", "detail": "slow", "tier": "slow"}
        await h.check()
        return True

    assert run_engine(tmp_path, body, fast_capacity=M)


def test_prefetch_without_room_fails_and_evicts_no_pinned_file(tmp_path):
    async def body(h):
        e = h.engine
        link = link_for(e)
        pinned = [await h.write_file(f"p{i}".encode(), bytes(300 * K)) for i in range(3)]
        for ino in pinned:
            await e.set_pinned(h.ns.get(ino), True)
        big = await h.write_file(b"big", b"b" * (200 * K))
        assert await e.move(h.ns.get(big), T.SLOW) is None
        used = e.fast_used
        assert used == 900 * K
        await answer(link, actions=[{"id": 1, "action": "prefetch", "path": "/big", "manifest_id": 1,
                                     "job": "j", "step": 0}])
        r = link.pending[1]
        assert r["state"] == "failed" and "no room" in r["detail"] and r["detail"].startswith("/big: ")
        assert r["job"] == "j" and r["step"] == 0
        assert h.tier(big) == T.SLOW
        assert all(h.tier(i) == T.FAST and h.ns.get(i).pinned for i in pinned)
        assert e.fast_used == used <= e.capacity

        # one pinned file unpinned: room is made by evicting it (never a pinned one)
        await e.set_pinned(h.ns.get(pinned[0]), False)
        await answer(link, actions=[{"id": 2, "action": "prefetch", "path": "/big"}])
        assert link.pending[2]["state"] == "done", link.pending[2]
        assert h.tier(big) == T.FAST and h.tier(pinned[0]) == T.SLOW
        assert all(h.tier(i) == T.FAST for i in pinned[1:])
        assert e.fast_used <= e.capacity

        # larger than the whole fast tier
        huge = await h.write_file(b"huge", bytes(M + K))
        assert h.tier(huge) == T.SLOW or await e.move(h.ns.get(huge), T.SLOW) is None
        await answer(link, actions=[{"id": 3, "action": "prefetch", "path": "/huge"}])
        assert link.pending[3]["state"] == "failed" and "no room" in link.pending[3]["detail"]
        assert "larger than the fast tier" in link.pending[3]["detail"]
        await h.check()
        return True

    assert run_engine(tmp_path, body, fast_capacity=M)


def test_prefetch_of_an_unknown_path_or_a_directory_fails(tmp_path):
    async def body(h):
        link = link_for(h.engine)
        await h.mkdir(b"d")
        await answer(link, actions=[{"id": 5, "action": "prefetch", "path": "/nope/x", "job": "j1"},
                                    {"id": 6, "action": "prefetch", "path": "/d"},
                                    {"id": 7, "action": "prefetch", "path": "relative"}])
        assert link.pending[5] == {"id": 5, "state": "failed", "detail": "no such file: /nope/x", "job": "j1"}
        assert link.pending[6]["state"] == "failed" and "not a regular file" in link.pending[6]["detail"]
        assert link.pending[7]["state"] == "failed" and "absolute path" in link.pending[7]["detail"]
        return True

    assert run_engine(tmp_path, body, fast_capacity=M)


def test_a_staged_file_is_no_victim_of_the_evictor_until_the_plan_unpins_it(tmp_path):
    """The hole the throttled bench showed: above its high watermark the evictor demoted the
    files a plan had staged before their jobs read them.  A prefetched file (promoted, or
    found on the fast tier) is kept there, read or not, until the plan's unpin of it; then
    it is a file like any other (here the oldest, the evictor's first victim).  The plan's
    own evict still moves it."""
    from .invariants import settle

    async def body(h):
        e, p = h.engine, h.engine.placement
        link = link_for(e)
        x = await h.write_file(b"x.dat", b"x" * (200 * K))
        assert await e.move(h.ns.get(x), T.SLOW) is None
        others = [await h.write_file(b"f%d" % i, b"f" * (100 * K)) for i in range(4)]  # 400 KiB
        await answer(link, actions=[{"id": 1, "action": "prefetch", "path": "/x.dat", "manifest_id": 1,
                                     "job": "j", "step": 1}])
        assert link.pending[1]["state"] == "done" and h.tier(x) == T.FAST
        for i in others:  # used after the prefetch: x is the least recently used file now
            await h.read_file(i)
        assert next(iter(e.policy.eviction_order())) == x and not p.evictable(h.ns.get(x))
        e.capacity = 620 * K  # 600 KiB used: above the 0.9 high watermark
        p.check_watermark()
        await settle(e)
        assert h.tier(x) == T.FAST  # staged: the evictor took the other files
        assert e.fast_used <= 0.5 * e.capacity
        # the job reads it: still held (a later job of the plan may read it too) until the unpin
        assert await h.read_file(x) == b"x" * (200 * K)
        assert not p.evictable(h.ns.get(x)) and not await p.room_for(500 * K, None)
        await answer(link, actions=[{"id": 4, "action": "unpin", "path": "/x.dat"}])
        assert link.pending[4]["state"] == "done" and p.evictable(h.ns.get(x))
        assert await p.room_for(500 * K, None) and h.tier(x) == T.SLOW
        # a staged file the plan evicts (demote) goes
        await answer(link, actions=[{"id": 2, "action": "prefetch", "path": "/x.dat"}])
        assert h.tier(x) == T.FAST and not p.evictable(h.ns.get(x))
        await answer(link, actions=[{"id": 3, "action": "demote", "path": "/x.dat"}])
        assert link.pending[3]["state"] == "done" and h.tier(x) == T.SLOW and x not in p.staged
        e.capacity = M
        await h.check()
        return True

    assert run_engine(tmp_path, body, fast_capacity=M, high_watermark=0.9, low_watermark=0.5,
                      promote_on_open=False)
