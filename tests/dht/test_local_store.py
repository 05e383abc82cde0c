"""LocalStore shared by several processes on one host (several agents without Redis)."""

from __future__ import annotations

import multiprocessing as mp

from hycache_dht.local_store import LocalStore
from hycache_dht.meta import EntryMeta, dir_meta


def _racer(path: str, who: int, names: int, start, out) -> None:
    store = LocalStore(path)
    start.wait()
    won = [i for i in range(names)
           if store.create(b"/shared/n%d" % i, EntryMeta("file", 0o100644, 0, 0, who, 0, 0, 0))]
    for _ in range(25):  # and a CAS counter every process increments
        while True:
            m = store.get(b"/shared/counter")
            if store.put(b"/shared/counter", m.copy(size=m.size + 1), expect_version=m.version):
                break
    store.close()
    out.put((who, won))


def test_processes_race_on_one_file(tmp_path):
    path = str(tmp_path / "meta.db")
    with LocalStore(path) as store:
        store.create(b"/shared", dir_meta())
        store.create(b"/shared/counter", EntryMeta("file", 0o100644, 0, 0, 0, 0, 0, 0))
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(path, w, 30, start, out)) for w in range(4)]
    for p in procs:
        p.start()
    start.set()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    winners = [i for won in results.values() for i in won]
    assert sorted(winners) == list(range(30))  # every name created exactly once
    with LocalStore(path) as store:
        for who, won in results.items():
            for i in won:
                assert store.get(b"/shared/n%d" % i).size == who
        assert store.get(b"/shared/counter").size == 100
        assert store.fsck()["problems"] == 0
