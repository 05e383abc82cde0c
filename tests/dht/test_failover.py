"""A Redis master dies (SIGKILL) in the middle of a workload: its replica is promoted, the
store's operations retry and succeed, and nothing that was acknowledged is lost."""

from __future__ import annotations

import threading
import time
import traceback

import pytest
from hycache_dht.meta import DHTUnavailable, dir_meta
from hycache_dht.redis_store import RedisClusterStore

from .test_contract import F

pytest_plugins = ["hycache_dht.testing"]


def test_master_killed_mid_workload(redis_cluster, dht_namespace, capsys):
    store = RedisClusterStore(redis_cluster.nodes, namespace=dht_namespace, op_timeout=30.0)
    impatient = RedisClusterStore(redis_cluster.nodes, namespace=dht_namespace, op_timeout=0.5)
    dirs = [b"/w%d" % i for i in range(12)]
    for d in dirs + [b"/ra", b"/rb"]:
        assert store.create(d, dir_meta())
    slot = store.c.keyslot(store._dkey(dirs[0]))
    victim = redis_cluster.master_of_slot(slot)
    on_victim = [d for d in dirs if redis_cluster.master_of_slot(store.c.keyslot(store._dkey(d))) == victim]
    assert store.create(b"/ra/moving", F(size=0))

    acked: dict[bytes, int] = {}  # path -> size acknowledged by create or put
    location = [b"/ra/moving"]  # where the last acknowledged rename put the file
    errors: list[BaseException] = []
    latencies: list[float] = []
    stop = threading.Event()

    def creator(t: int) -> None:
        n = 0
        try:
            while not stop.is_set():
                d = dirs[(t + 4 * n) % len(dirs)]
                p = d + b"/t%d-%d" % (t, n)
                t0 = time.monotonic()
                assert store.create(p, F(size=n))
                acked[p] = n
                m = store.get(p)
                v = store.put(p, m.copy(size=n + 1), expect_version=m.version)
                assert v is not None
                acked[p] = n + 1
                latencies.append(time.monotonic() - t0)
                n += 1
        except BaseException as e:
            errors.append((time.monotonic(), p, e, traceback.format_exc()))

    def renamer() -> None:
        try:
            while not stop.is_set():
                a = location[0]
                b = (b"/rb/moving" if a.startswith(b"/ra") else b"/ra/moving")
                store.rename(a, b)
                location[0] = b
        except BaseException as e:
            errors.append((time.monotonic(), location[0], e, traceback.format_exc()))

    threads = [threading.Thread(target=creator, args=(t,)) for t in range(3)]
    threads.append(threading.Thread(target=renamer))
    for th in threads:
        th.start()
    try:
        time.sleep(1.0)
        before = len(acked)
        redis_cluster.kill_master(victim)
        t_kill = time.monotonic()
        # an impatient client gets a clear exception, not a silent failure
        with pytest.raises(DHTUnavailable):
            for i in range(1000):
                impatient.create(on_victim[0] + b"/impatient%d" % i, F())
        promoted = redis_cluster.wait_failover(victim)
        t_failover = time.monotonic() - t_kill
        n_at_failover = len(acked)
        time.sleep(1.5)
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    for _, _, _, tb in errors:
        print(tb)
    assert not errors, [(f"{t - t_kill:+.2f}s after the kill", p, e) for t, p, e, _ in errors]
    after = len(acked)
    # every acknowledged create/put survived the failover
    for p, size in acked.items():
        m = store.get(p)
        assert m is not None and m.size == size, (p, size, m)
    assert store.get(location[0]) is not None
    assert store.get(b"/ra/moving" if location[0].startswith(b"/rb") else b"/rb/moving") is None
    assert sum(1 for d in on_victim for _ in store.list_dir(d)) > 0
    stats = store.stats()
    with capsys.disabled():
        print(f"\nfailover: killed master :{victim}, replica :{promoted} promoted after "
              f"{t_failover:.1f} s; {before} entries acked before the kill, {n_at_failover} when "
              f"promoted, {after} at the end; slowest op {max(latencies):.2f} s; client {stats}")
    assert stats.get("retry", 0) > 0  # the failover was seen and retried through
    assert after > n_at_failover  # and the workload went on after it
    # the cluster is shared by the session: bring the dead node back (it rejoins as replica)
    redis_cluster.start_node(victim)
    redis_cluster.wait_healthy(60)
    assert store.fsck()["problems"] == 0
    store.close()
    impatient.close()
