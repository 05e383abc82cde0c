"""A 2LS plan step for a file another node holds (issue 9, agent side): ``prefetch``
fetches it once into this node's fast-tier remote cache, the job's later open reads that
copy without another fetch and counts as a fast-tier hit; the copy counts in the fast
tier's use; no room → failed, nothing pinned evicted; unknown path → failed.

Node ``a`` is a real mount (a subprocess agent) on a real Redis Cluster; node ``b`` is a
real engine with its cluster link and peer service running in this process, driven the
way the kernel and the control plane's answers would (FUSE operations and
``ControlLink.handle_answer`` called directly, no fake control plane)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
import trio
from clusterkit import free_port, redis_addr, start_agents, wait_published
from hycache_agent.cluster import remote_view
from hycache_agent.config import AgentConfig
from hycache_agent.control.link import ControlLink
from hycache_agent.fs import tiers as T
from hycache_agent.fs.engine import TieringEngine
from hycache_agent.fs.namespace import ROOT_INO
from hycache_agent.mount import build_agent, control_link, start_cluster

pytestmark = pytest.mark.mount

K = 1 << 10
M = 1 << 20


@dataclass
class Ctx:
    uid: int = 0
    gid: int = 0
    pid: int = field(default_factory=os.getpid)
    umask: int = 0o022


async def answer(link: ControlLink, actions) -> None:
    async with trio.open_nursery() as nursery:
        await link.handle_answer({"interval": 1.0, "policy": None, "actions": actions, "acked_results": []},
                                 nursery)


def test_prefetch_of_a_remote_file_fetches_once_and_the_jobs_open_is_a_hit(
        hycache_mount, redis_cluster, dht_namespace, secret_file, tmp_path, monkeypatch):
    redis = redis_addr(redis_cluster)
    (a,) = start_agents(hycache_mount, redis, secret_file, dht_namespace, names=("a",))
    shared, other = os.urandom(300 * K), os.urandom(400 * K)
    (a.mountpoint / "in").mkdir()
    (a.mountpoint / "later").mkdir()  # (a directory this node will list but hold nothing in)
    (a.mountpoint / "in" / "shared.bin").write_bytes(shared)
    (a.mountpoint / "in" / "other.bin").write_bytes(other)
    (a.mountpoint / "in" / "big.bin").write_bytes(bytes(2 * M))
    wait_published(a)

    root = tmp_path / "b"
    (root / "mnt").mkdir(parents=True)
    config = AgentConfig(root=root, mountpoint=root / "mnt", fast_capacity=M, redis=redis,
                         dht_namespace=dht_namespace, node_id="b", listen=f"127.0.0.1:{free_port()}",
                         cluster_secret_file=secret_file, rebalance_interval=0)
    engine = TieringEngine(config)
    engine.start()
    agent = build_agent(config, engine)
    ctx = Ctx()

    async def main():
        async with trio.open_nursery() as nursery:
            await engine.run(nursery)
            await start_cluster(agent.cluster, agent.status, nursery)
            cluster, ops = agent.cluster, agent.ops
            link = control_link(engine, cluster, "http://control.invalid:8000", "t0ken", node_id="b", address=None)
            with trio.fail_after(60):
                while cluster.status.state != "ok" or "a" not in cluster.known_nodes:
                    await trio.sleep(0.1)
            c0 = engine.counters_dict()

            # the plan step: fetched once, into the fast tier's remote cache, counted there
            step = {"manifest_id": 3, "job": "j2", "step": 0}
            await answer(link, [{"id": 1, "action": "prefetch", "path": "/in/shared.bin", "size": 300 * K,
                                 "source": "a", **step}])
            r = link.pending[1]
            assert r["state"] == "done" and r["detail"].startswith("fast (fetched") and "from a" in r["detail"], r
            assert {k: r[k] for k in step} == step
            assert cluster.status.remote_fetches == 1 and cluster.status.remote_bytes == 300 * K
            assert engine.remote_cache_used == 300 * K and engine.fast_used == 300 * K
            copies = os.listdir(cluster.cache_dir)
            assert len(copies) == 1 and (cluster.cache_dir / copies[0]).stat().st_size == 300 * K
            st = await engine.status()
            assert st["tiers"][T.FAST]["used"] == 300 * K and st["tiers"][T.FAST]["remote_cache_bytes"] == 300 * K

            # the step delivered again under a new id: nothing fetched again
            await answer(link, [{"id": 2, "action": "prefetch", "path": "/in/shared.bin"}])
            assert link.pending[2]["detail"] == "already fast (remote copy)"
            assert cluster.status.remote_fetches == 1

            # the job opens the file as the kernel would: lookup, open, read, release
            d = await ops.lookup(ROOT_INO, b"in", ctx)
            entry = await ops.lookup(d.st_ino, b"shared.bin", ctx)
            fi = await ops.open(entry.st_ino, os.O_RDONLY, ctx)
            data = await ops.read(fi.fh, 0, 400 * K)
            await ops.release(fi.fh)
            assert data == shared
            c = engine.counters_dict()
            assert cluster.status.remote_fetches == 1  # no second fetch
            assert c["fast"]["hits"] == c0["fast"]["hits"] + 1 and c["misses"] == c0["misses"]
            assert c["remote"]["opens"] == c0["remote"]["opens"] + 1
            assert c["remote"]["read_bytes"] == c0["remote"]["read_bytes"] + 300 * K

            # an open with no copy on the fast tier is still a miss (and fetches)
            e2 = await ops.lookup(d.st_ino, b"other.bin", ctx)
            fi = await ops.open(e2.st_ino, os.O_RDONLY, ctx)
            assert await ops.read(fi.fh, 0, 500 * K) == other
            await ops.release(fi.fh)
            c = engine.counters_dict()
            assert c["misses"] == c0["misses"] + 1
            # HCCache is on (the default): a 400 KiB file is above its small-file bound, so it
            # was read by 128 KiB range requests into memory, not copied to the fast tier
            assert cluster.status.remote_fetches == 1 + 4
            assert engine.remote_cache_used == 300 * K and engine.fast_used == 300 * K
            await ops.forget([(e2.st_ino, 1)])  # the kernel forgets it: nothing of it was on the fast tier
            assert engine.remote_cache_used == 300 * K and engine.fast_used == 300 * K

            # no room: a pinned local file and the job's copy fill the fast tier
            fi, attrs = await ops.create(ROOT_INO, b"local.bin", 0o100644, os.O_RDWR | os.O_CREAT, ctx)
            await ops.write(fi.fh, 0, bytes(600 * K))
            await ops.release(fi.fh)
            local = engine.ns.get(attrs.st_ino)
            await engine.set_pinned(local, True)
            assert local.tier == T.FAST and engine.fast_used == 900 * K
            await answer(link, [{"id": 3, "action": "prefetch", "path": "/in/other.bin", **step, "step": 1},
                                {"id": 4, "action": "prefetch", "path": "/in/big.bin"},
                                {"id": 5, "action": "prefetch", "path": "/in/nowhere.bin"}])
            r3, r4, r5 = (link.pending[i] for i in (3, 4, 5))
            assert r3["state"] == "failed" and r3["detail"].startswith("/in/other.bin: no room"), r3
            assert r3["step"] == 1 and r3["manifest_id"] == 3
            assert r4["state"] == "failed" and "larger than the fast tier" in r4["detail"], r4
            assert r5 == {"id": 5, "state": "failed", "detail": "no such file: /in/nowhere.bin"}
            assert local.tier == T.FAST and local.pinned  # nothing pinned evicted
            assert engine.fast_used == 900 * K <= engine.capacity
            assert cluster.status.remote_fetches == 5  # nothing fetched for the failed steps

            # unpinned, the local file makes room for the step (the evictor's usual victim)
            await engine.set_pinned(local, False)
            await answer(link, [{"id": 6, "action": "prefetch", "path": "/in/other.bin"}])
            assert link.pending[6]["state"] == "done", link.pending[6]
            assert local.tier == T.SLOW and engine.fast_used == 700 * K <= engine.capacity
            assert cluster.status.remote_fetches == 6  # the prefetch fetched it whole

            # a plan's evict of a copy (demote of a path node a holds) drops it from the fast
            # tier, unless it is open; a later open fetches it again
            e2 = await ops.lookup(d.st_ino, b"other.bin", ctx)  # (forgotten above)
            fi = await ops.open(e2.st_ino, os.O_RDONLY, ctx)
            await answer(link, [{"id": 7, "action": "demote", "path": "/in/other.bin"}])
            assert link.pending[7]["state"] == "failed" and "in use" in link.pending[7]["detail"], link.pending[7]
            await ops.release(fi.fh)
            await answer(link, [{"id": 8, "action": "demote", "path": "/in/other.bin"}])
            await answer(link, [{"id": 9, "action": "demote", "path": "/in/other.bin"}])
            assert link.pending[8] == {"id": 8, "state": "done", "detail": f"remote copy dropped ({400 * K} bytes)",
                                       "tier": "remote"}
            assert link.pending[9]["detail"] == "no remote copy here"
            assert engine.remote_cache_used == 300 * K and engine.fast_used == 300 * K
            assert len(os.listdir(cluster.cache_dir)) == 1
            fi = await ops.open(e2.st_ino, os.O_RDONLY, ctx)
            assert await ops.read(fi.fh, 0, 500 * K) == other
            await ops.release(fi.fh)

            # a name published after this node listed its directory (lookups are answered
            # from the listing for a while; held long here): once a prefetch fetched it, the
            # job's lookup finds it at once instead of an ENOENT the kernel would keep for 1 s.
            # In a directory where this node holds no remote file yet: it hears no
            # announcements of its changes (in /in one would make it list again at once).
            dl = await ops.lookup(ROOT_INO, b"later", ctx)
            assert dl.st_ino != 0
            monkeypatch.setattr(remote_view, "META_TTL_SECONDS", 600.0)
            # (no such name: a negative entry, inode 0, that the kernel keeps a while)
            assert (await ops.lookup(dl.st_ino, b"late.bin", ctx)).st_ino == 0  # lists /later: no late.bin yet
            late = os.urandom(100 * K)
            await trio.to_thread.run_sync((a.mountpoint / "later" / "late.bin").write_bytes, late)
            await trio.to_thread.run_sync(wait_published, a)
            assert (await ops.lookup(dl.st_ino, b"late.bin", ctx)).st_ino == 0  # the listing still says no
            await answer(link, [{"id": 10, "action": "prefetch", "path": "/later/late.bin"}])
            assert link.pending[10]["state"] == "done", link.pending[10]
            e3 = await ops.lookup(dl.st_ino, b"late.bin", ctx)
            fi = await ops.open(e3.st_ino, os.O_RDONLY, ctx)
            assert await ops.read(fi.fh, 0, 200 * K) == late
            await ops.release(fi.fh)
            await ops.forget([(entry.st_ino, 1), (e2.st_ino, 1), (e3.st_ino, 1), (d.st_ino, 1), (dl.st_ino, 1)])
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        engine.close()
        agent.cluster.close()
