"""ONE contract for every metadata store engine (LocalStore on SQLite, RedisClusterStore on
a real local Redis Cluster): each test runs once per engine (the ``engine`` fixture)."""

from __future__ import annotations

import errno
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hycache_dht.meta import DHTError, EntryMeta, NotPrimary, Op, dir_meta, pack_body

pytest_plugins = ["hycache_dht.testing"]

D = dir_meta(0o755, 1000, 1000, now_ns=5)


def F(size: int = 10, **kw) -> EntryMeta:
    base = dict(kind="file", mode=0o100644, uid=1000, gid=1000, size=size, atime_ns=1,
                mtime_ns=2, ctime_ns=3, primary="node-1", replicas=["node-2"], tier="fast")
    base.update(kw)
    return EntryMeta(**base)


def content(m: EntryMeta | None):
    return None if m is None else (m.kind, pack_body(m))


def tree(store, top: bytes) -> dict | None:
    """{relative path: content} of ``top`` and everything below it (None if absent)."""
    m = store.get(top)
    if m is None:
        return None
    out = {b"": content(m)}
    if m.kind == "dir":
        for name, child in store.list_dir(top):
            sub = tree(store, top + b"/" + name)
            assert sub is not None and sub[b""] == content(child)
            out.update({b"/" + name + k: v for k, v in sub.items()})
    return out


def run_threads(n: int, fn) -> list:
    barrier = threading.Barrier(n)

    def go(i):
        barrier.wait()
        return fn(i)

    with ThreadPoolExecutor(n) as ex:
        return list(ex.map(go, range(n)))


# -- basics -------------------------------------------------------------------------------


def test_root_always_exists(store):
    root = store.get(b"/")
    assert root.kind == "dir" and root.mode & 0o040000
    assert store.create(b"/", D) is False
    with pytest.raises(OSError) as e:
        store.delete(b"/")
    assert e.value.errno == errno.EBUSY
    assert list(store.list_dir(b"/")) == []
    v = store.put(b"/", dir_meta(0o700))
    assert v and store.get(b"/").mode == 0o040700 and store.get(b"/").version == v
    with pytest.raises(NotADirectoryError):
        store.put(b"/", F())


def test_create_get_every_field(store):
    assert store.create(b"/d", D)
    full = F(size=1 << 40, replicas=["a", "b", "c"], tier="slow", rdev=0)
    link = EntryMeta("symlink", 0o120777, 0, 0, 3, 4, 5, 6, target=b"\xff\xfe/non-utf8\x00x")
    dev = EntryMeta("special", 0o020644, 0, 0, 0, 7, 8, 9, rdev=(8 << 8) | 1)
    for name, m in ((b"/d/f", full), (b"/d/l", link), (b"/d/c", dev)):
        assert store.create(name, m) is True
        got = store.get(name)
        assert content(got) == content(m), (got, m)
        assert got.version > 0 and got.writer is None and got.lease_until == 0
    assert store.get(b"/d/l").target == b"\xff\xfe/non-utf8\x00x"
    assert store.get(b"/d/missing") is None
    assert store.get(b"/nodir/x") is None
    for bad in (b"relative", b"/a/", b"/a//b", b"/a/./b", b"/a/../b", b"/a\0b"):
        with pytest.raises(ValueError):
            store.get(bad)
    with pytest.raises(TypeError):
        store.get("/str")
    with pytest.raises(ValueError):
        store.create(b"/d/k", F(kind="fifo"))


def test_create_existing_is_false_and_keeps_the_first(store):
    assert store.create(b"/x", F(size=1))
    assert store.create(b"/x", F(size=2)) is False
    assert store.get(b"/x").size == 1


def test_put_upsert_and_cas(store):
    v1 = store.put(b"/p", F(size=1))
    assert v1 > 0 and store.get(b"/p").version == v1
    assert store.put(b"/p", F(size=2), expect_version=0) is None  # 0 = must not exist
    assert store.put(b"/p", F(size=3), expect_version=v1 + 1000) is None
    v2 = store.put(b"/p", F(size=4), expect_version=v1)
    assert v2 > v1 and store.get(b"/p").size == 4
    assert store.put(b"/p", F(size=5), expect_version=v1) is None  # stale token
    assert store.put(b"/q", F(), expect_version=7) is None  # CAS on a missing entry
    assert store.put(b"/q", F(), expect_version=0) > 0
    with pytest.raises(IsADirectoryError):
        store.create(b"/dd", D) and store.put(b"/dd", F())
    with pytest.raises(NotADirectoryError):
        store.put(b"/p", D)
    assert store.put(b"/p", F(kind="symlink", target=b"t")) > v2  # file <-> symlink is fine


def test_put_owner_guard_refuses_a_file_taken_over_by_another_node(store):
    """A node publishing its own file passes owners=(itself,): once another node has
    taken the file over (it is the primary now), the old holder's put changes nothing."""
    v1 = store.put(b"/o", F(primary="a", size=1), owners=("a",))
    assert v1 and store.put(b"/o", F(primary="a", size=2), owners=("a",)) > v1
    v2 = store.put(b"/o", F(primary="b", size=3), owners=("b", "a"))  # b takes over from a
    with pytest.raises(NotPrimary) as e:
        store.put(b"/o", F(primary="a", size=4), owners=("a",))
    assert e.value.primary == "b" and e.value.version == v2 and e.value.errno == errno.EPERM
    got = store.get(b"/o")
    assert (got.primary, got.size, got.version) == ("b", 3, v2)
    assert store.put(b"/new", F(primary="a"), owners=("a",))  # a missing entry: no guard
    store.create(b"/gd", D)
    assert store.put(b"/gd", D, owners=("z",))  # directories have no primary: no guard
    [res] = store.apply([Op.put(b"/o", F(primary="a", size=5), owners=("a",))])
    assert isinstance(res, NotPrimary) and res.primary == "b"
    [ok] = store.apply([Op.put(b"/o", F(primary="a", size=6), owners=("a", "b"))])
    assert ok > v2 and store.get(b"/o").primary == "a"
    with pytest.raises(ValueError):
        store.put(b"/o", F(), owners=("a|b",))


def test_delete_and_cas(store):
    assert store.delete(b"/none") is False
    store.create(b"/f", F())
    v = store.get(b"/f").version
    assert store.delete(b"/f", expect_version=v + 1) is False
    assert store.delete(b"/f", expect_version=v) is True
    assert store.get(b"/f") is None and store.delete(b"/f") is False


def test_rmdir_rules_and_recreate(store):
    store.create(b"/d", D)
    store.create(b"/d/f", F())
    with pytest.raises(OSError) as e:
        store.delete(b"/d")
    assert e.value.errno == errno.ENOTEMPTY
    assert store.delete(b"/d/f") and store.delete(b"/d") is True
    assert store.get(b"/d") is None
    with pytest.raises(FileNotFoundError):
        list(store.list_dir(b"/d"))
    # a removed directory refuses creates under it (no orphans)
    with pytest.raises(FileNotFoundError):
        store.create(b"/d/late", F())
    with pytest.raises(FileNotFoundError):
        store.put(b"/d/late", F())
    with pytest.raises(FileNotFoundError):
        store.create(b"/never/x", F())
    store.create(b"/file", F())
    with pytest.raises(FileNotFoundError):
        store.create(b"/file/x", F())
    # the same path can become a directory again, and works as one
    assert store.create(b"/d", D)
    assert store.create(b"/d/g", F()) and [n for n, _ in store.list_dir(b"/d")] == [b"g"]
    v = store.get(b"/d").version
    store.delete(b"/d/g")
    assert store.delete(b"/d", expect_version=v + 99) is False and store.get(b"/d")
    assert store.delete(b"/d", expect_version=v) is True


def test_list_dir(store):
    store.create(b"/l", D)
    names = {b"a", b"b", b"sub"}
    for n in names:
        store.create(b"/l/" + n, D if n == b"sub" else F(size=len(n)))
    got = dict(store.list_dir(b"/l"))
    assert set(got) == names and got[b"sub"].kind == "dir" and got[b"a"].size == 1
    with pytest.raises(FileNotFoundError):
        store.list_dir(b"/nope")
    with pytest.raises(NotADirectoryError):
        store.list_dir(b"/l/a")
    assert list(store.list_dir(b"/l/sub")) == []


def test_non_utf8_and_odd_names(store):
    odd = [b"\xff\xfe", b"caf\xe9", b"{tag}", b"}{", b"a\nb", b"*?[x]", b" ", b"-", b"\x01",
           "é漢字".encode(), b"x" * 255]
    store.create(b"/\xff", D)
    for n in odd:
        assert store.create(b"/\xff/" + n, F(size=len(n)))
    assert {n for n, _ in store.list_dir(b"/\xff")} == set(odd)
    store.create(b"/\xff/\x80dir", D)
    store.create(b"/\xff/\x80dir/\xfe\xfe", F())
    store.create(b"/ok", D)
    store.rename(b"/\xff/\x80dir", b"/ok/\xc3\x28")  # invalid UTF-8 destination too
    assert store.get(b"/ok/\xc3\x28/\xfe\xfe") is not None
    store.rename(b"/\xff/{tag}", b"/ok/}{")
    assert store.get(b"/ok/}{").size == 5
    assert store.get(b"/\xff/}{").size == 2  # same name, other directory: untouched


# -- concurrency --------------------------------------------------------------------------


def test_racing_creates_exactly_one_wins(store):
    store.create(b"/race", D)
    for round_ in range(10):
        name = b"/race/f%d" % round_
        wins = run_threads(8, lambda i, name=name: store.create(name, F(size=i)))
        assert wins.count(True) == 1, wins
        assert store.get(name).size == wins.index(True)


def test_cas_increments_from_threads_are_never_lost(store):
    store.create(b"/counter", F(size=0))

    def worker(_):
        for _ in range(15):
            while True:
                m = store.get(b"/counter")
                if store.put(b"/counter", m.copy(size=m.size + 1), expect_version=m.version):
                    break

    run_threads(4, worker)
    assert store.get(b"/counter").size == 60


def test_write_lease_cas_renew_expiry(store):
    store.create(b"/w", F())
    v = store.get(b"/w").version
    with pytest.raises(FileNotFoundError):
        store.acquire_write(b"/nope", "n1", 5)
    assert store.acquire_write(b"/w", "n1", 0.6)
    assert store.acquire_write(b"/w", "n2", 0.6) is False  # held
    m = store.get(b"/w")
    assert m.writer == "n1" and m.lease_until > time.time() + 0.2 and m.version == v
    time.sleep(0.3)
    assert store.acquire_write(b"/w", "n1", 0.6)  # renewal by the holder pushes it out
    assert store.get(b"/w").lease_until > m.lease_until
    time.sleep(0.4)  # past the first lease, within the renewed one
    assert store.acquire_write(b"/w", "n2", 0.6) is False
    # metadata updates keep the lease (the write flag has its own CAS)
    assert store.put(b"/w", F(size=77)) and store.get(b"/w").writer == "n1"
    time.sleep(0.7)  # the holder died: no lock survives it
    assert store.acquire_write(b"/w", "n2", 5)
    assert store.get(b"/w").writer == "n2"
    store.release_write(b"/w", "n1")  # not the holder: no effect
    assert store.get(b"/w").writer == "n2"
    store.release_write(b"/w", "n2")
    m = store.get(b"/w")
    assert m.writer is None and m.lease_until == 0 and m.size == 77
    store.release_write(b"/nope", "n1")  # harmless


def test_racing_lease_acquire_one_holder(store):
    store.create(b"/lease", F())
    for _ in range(5):
        got = run_threads(6, lambda i: store.acquire_write(b"/lease", f"n{i}", 30))
        assert got.count(True) == 1, got
        store.release_write(b"/lease", store.get(b"/lease").writer)


# -- rename -------------------------------------------------------------------------------


def test_rename_file_same_directory(store):
    store.create(b"/r", D)
    store.create(b"/r/a", F(size=1))
    store.create(b"/r/b", F(size=2))
    store.acquire_write(b"/r/a", "n1", 30)
    with pytest.raises(FileExistsError):
        store.rename(b"/r/a", b"/r/b", replace=False)
    store.rename(b"/r/a", b"/r/c", replace=False)
    assert store.get(b"/r/a") is None and store.get(b"/r/c").size == 1
    assert store.get(b"/r/c").writer == "n1"  # the lease moves with the file
    store.rename(b"/r/c", b"/r/b")  # replace
    assert store.get(b"/r/c") is None and store.get(b"/r/b").size == 1
    with pytest.raises(FileNotFoundError):
        store.rename(b"/r/c", b"/r/d")
    store.rename(b"/r/b", b"/r/b")  # same name: nothing happens
    assert store.get(b"/r/b").size == 1
    store.create(b"/r/dir", D)
    with pytest.raises(IsADirectoryError):
        store.rename(b"/r/b", b"/r/dir")
    with pytest.raises(OSError):
        store.rename(b"/", b"/r/x")


def test_rename_file_across_directories(store):
    for d in (b"/s", b"/t"):
        store.create(d, D)
    store.create(b"/s/f", F(size=1))
    store.create(b"/t/f", F(size=2))
    with pytest.raises(FileExistsError):
        store.rename(b"/s/f", b"/t/f", replace=False)
    assert store.get(b"/s/f").size == 1 and store.get(b"/t/f").size == 2
    store.rename(b"/s/f", b"/t/g", replace=False)
    assert store.get(b"/s/f") is None and store.get(b"/t/g").size == 1
    store.rename(b"/t/g", b"/s/f")
    store.rename(b"/s/f", b"/t/f")  # replace across directories
    assert store.get(b"/s/f") is None and store.get(b"/t/f").size == 1
    assert [n for n, _ in store.list_dir(b"/t")] == [b"f"]
    with pytest.raises(FileNotFoundError):
        store.rename(b"/t/f", b"/missing/f")
    with pytest.raises(FileNotFoundError):
        store.rename(b"/s/none", b"/t/none")


def _make_tree(store, top: bytes, depth: int = 3, files: int = 3) -> None:
    store.create(top, D)
    for i in range(files):
        store.create(top + b"/f%d" % i, F(size=i, primary=f"n{i}"))
    store.create(top + b"/link", EntryMeta("symlink", 0o120777, 0, 0, 1, 1, 1, 1, target=b"f0"))
    if depth > 1:
        _make_tree(store, top + b"/sub", depth - 1, files)
        store.create(top + b"/empty", D)


@pytest.mark.parametrize("same_parent", [True, False])
def test_rename_directory_moves_its_subtree(store, same_parent):
    store.create(b"/x", D)
    store.create(b"/y", D)
    _make_tree(store, b"/x/src")
    before = tree(store, b"/x/src")
    dst = b"/x/moved" if same_parent else b"/y/moved"
    store.rename(b"/x/src", dst)
    assert store.get(b"/x/src") is None and store.get(b"/x/src/sub/f1") is None
    assert tree(store, dst) == before
    # the moved directories work: create, CAS, lease and list in the new place
    assert store.create(dst + b"/sub/sub/new", F())
    m = store.get(dst + b"/sub/f1")
    assert store.put(dst + b"/sub/f1", m.copy(size=99), expect_version=m.version)
    assert store.acquire_write(dst + b"/sub/f1", "n9", 30)
    # a writer that still uses an old path cannot create under it
    with pytest.raises(FileNotFoundError):
        store.create(b"/x/src/sub/ghost", F())
    assert store.get(b"/x/src/sub/f1") is None


def test_rename_directory_replace_rules(store):
    store.create(b"/m", D)
    _make_tree(store, b"/m/a", depth=2)
    store.create(b"/m/empty", D)
    store.create(b"/m/full", D)
    store.create(b"/m/full/x", F())
    store.create(b"/m/file", F())
    before = tree(store, b"/m/a")
    with pytest.raises(OSError) as e:
        store.rename(b"/m/a", b"/m/full")
    assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(NotADirectoryError):
        store.rename(b"/m/a", b"/m/file")
    with pytest.raises(FileExistsError):
        store.rename(b"/m/a", b"/m/empty", replace=False)
    with pytest.raises(OSError) as e:
        store.rename(b"/m/a", b"/m/a/sub/inside")
    assert e.value.errno == errno.EINVAL
    assert tree(store, b"/m/a") == before  # nothing moved
    store.rename(b"/m/a", b"/m/empty")  # replaces the empty directory
    assert tree(store, b"/m/empty") == before and store.get(b"/m/a") is None


def test_racing_renames_of_one_source(store):
    store.create(b"/rr", D)
    for r in range(4):
        src = b"/rr/src%d" % r
        _make_tree(store, src, depth=2, files=2) if r % 2 else store.create(src, F())
        want = tree(store, src)

        def go(i, src=src, r=r):
            try:
                store.rename(src, b"/rr/dst%d-%d" % (r, i))
                return i
            except FileNotFoundError:
                return None

        won = [x for x in run_threads(3, go) if x is not None]
        assert len(won) == 1, won
        assert store.get(src) is None and tree(store, b"/rr/dst%d-%d" % (r, won[0])) == want


def test_rmdir_and_create_during_a_directory_rename(store):
    """While a directory rename is half done, an rmdir of it and a create in it wait for the
    rename and then see the outcome: the directory moved, nothing is lost or orphaned."""
    store.create(b"/mv", D)
    store.create(b"/mv/d", D)
    store.create(b"/mv/d/x", F())
    store.create(b"/mv/e", D)  # empty: an rmdir of it would succeed if it did not move
    paused, go = threading.Event(), threading.Event()

    def hook(name):
        if name in ("copy", "rekey") and not paused.is_set():
            paused.set()
            assert go.wait(30)

    store.step_hook = hook
    mover = threading.Thread(target=store.rename, args=(b"/mv/e", b"/mv/e2"))
    mover.start()
    assert paused.wait(30)
    results = {}

    def rmdir():
        results["rmdir"] = store.delete(b"/mv/e")

    def create():
        try:
            results["create"] = store.create(b"/mv/e/new", F())
        except FileNotFoundError:
            results["create"] = "ENOENT"

    others = [threading.Thread(target=rmdir), threading.Thread(target=create)]
    for t in others:
        t.start()
    time.sleep(0.3)
    go.set()
    mover.join(30)
    for t in others:
        t.join(30)
    store.step_hook = None
    assert results["rmdir"] is False  # it had moved: nothing to remove under the old name
    assert results["create"] == "ENOENT"
    assert store.get(b"/mv/e") is None and store.get(b"/mv/e2").kind == "dir"
    assert list(store.list_dir(b"/mv/e2")) == []


def test_rename_and_cas_writer_lose_nothing(store):
    """A writer updates a file with CAS while it moves between directories: every
    acknowledged update is in the file under the name it ends with."""
    for d in (b"/ra", b"/rb"):
        store.create(d, D)
    store.create(b"/ra/f", F(size=0))
    stop = threading.Event()
    acked = []

    def writer():
        while not stop.is_set():
            for path in (b"/ra/f", b"/rb/f"):
                m = store.get(path)
                if m is not None and store.put(path, m.copy(size=m.size + 1), expect_version=m.version):
                    acked.append(m.size + 1)

    t = threading.Thread(target=writer)
    t.start()
    try:
        for i in range(10):
            seen = len(acked)
            deadline = time.monotonic() + 10
            while len(acked) < seen + 2 and time.monotonic() < deadline:
                time.sleep(0.001)  # let the writer in between renames
            a, b = (b"/ra/f", b"/rb/f") if i % 2 == 0 else (b"/rb/f", b"/ra/f")
            store.rename(a, b)
    finally:
        stop.set()
        t.join()
    final = store.get(b"/ra/f")
    assert store.get(b"/rb/f") is None and final is not None
    assert acked and final.size == max(acked) == len(acked)


# -- batches ------------------------------------------------------------------------------


def test_apply_batch(store):
    ops = [Op.create(b"/b", D)]
    ops += [Op.create(b"/b/f%d" % i, F(size=i)) for i in range(50)]
    ops += [Op.create(b"/b/f0", F()), Op.put(b"/b/f1", F(size=100)),
            Op.put(b"/b/f2", F(), expect_version=12345), Op.delete(b"/b/f3"),
            Op.delete(b"/b/none"), Op.create(b"/b/sub", D), Op.create(b"/b/sub/x", F()),
            Op.delete(b"/b/sub/x"), Op.delete(b"/b/sub"), Op.put(b"/b", F()),
            Op.create(b"/b/bad/../x", F())]
    res = store.apply(ops)
    assert res[:51] == [True] * 51
    created_again, put_v, cas, deleted, missing, mk, cr, dl, rmd, kind, bad = res[51:]
    assert created_again is False and isinstance(put_v, int) and cas is None
    assert deleted is True and missing is False and mk and cr and dl and rmd is True
    assert isinstance(kind, IsADirectoryError) and isinstance(bad, ValueError)
    assert store.get(b"/b/f1").size == 100 and store.get(b"/b/f3") is None
    assert store.get(b"/b/sub") is None
    assert sum(1 for _ in store.list_dir(b"/b")) == 49
    assert store.apply([]) == []


def test_apply_batch_write_leases(store):
    """The write flag's acquire/release as batch ops: same answers as acquire_write and
    release_write, in order with the puts and deletes of the same batch."""
    res = store.apply([Op.create(b"/l", D), Op.put(b"/l/a", F()), Op.acquire(b"/l/a", "n1", 30),
                       Op.acquire(b"/l/a", "n2", 30), Op.acquire(b"/l/none", "n1", 30),
                       Op.put(b"/l/b", F()), Op.acquire(b"/l/b", "n2", 30),
                       Op.release(b"/l/b", "n1"), Op.release(b"/l/none", "n1"),
                       Op.acquire(b"/l/a", "bad|id", 30)])
    assert res[0] is True and isinstance(res[1], int) and res[2] is True and res[3] is False
    assert isinstance(res[4], FileNotFoundError)
    assert res[6] is True and res[7] is None and res[8] is None and isinstance(res[9], ValueError)
    assert store.get(b"/l/a").writer == "n1"
    assert store.get(b"/l/b").writer == "n2"  # a release by a node that does not hold it: no effect
    v = store.get(b"/l/a").version
    assert store.apply([Op.release(b"/l/a", "n1"), Op.acquire(b"/l/b", "n2", 30)]) == [None, True]
    m = store.get(b"/l/a")
    assert m.writer is None and m.lease_until == 0 and m.version == v  # the flag has its own CAS
    assert store.acquire_write(b"/l/a", "n2", 30)


def test_apply_batch_put_then_acquire(store):
    """A put followed by the acquire of the same name (one step on Redis): the flag is
    taken only from nobody or from its own holder, and the put is applied either way."""
    assert store.apply([Op.create(b"/h", D), Op.put(b"/h/a", F()), Op.acquire(b"/h/a", "n1", 30)])[2] is True
    res = store.apply([Op.put(b"/h/a", F(size=5)), Op.acquire(b"/h/a", "n2", 30),
                       Op.put(b"/h/a", F(size=6)), Op.acquire(b"/h/a", "n1", 30),
                       Op.put(b"/h/b", F(size=7)), Op.acquire(b"/h/b", "n2", 30)])
    assert isinstance(res[0], int) and res[1] is False and isinstance(res[2], int) and res[3] is True
    assert isinstance(res[4], int) and res[5] is True
    a, b = store.get(b"/h/a"), store.get(b"/h/b")
    assert a.size == 6 and a.writer == "n1" and b.size == 7 and b.writer == "n2"


# the agents' Redis user as deployed (deploy/redis/redis-start.sh, ansible/roles/redis_cluster):
# the namespace's keys, scripting, no pub/sub channels
DEPLOYED_RULES = ("resetchannels -@all +@read +@write +@scripting +@connection +@transaction -@dangerous "
                  "+cluster|slots +cluster|shards +cluster|nodes +cluster|info +cluster|myid +cluster|keyslot "
                  "+command +info +time +wait +readonly +readwrite +asking +client|setname +client|id").split()


def test_a_batch_applies_for_a_user_without_pub_sub_channels(redis_cluster, dht_namespace):
    """The announcements inside a batch are best effort: with the deployed ACL (no
    channels) a create, a put and its acquire still apply, and nothing of them is lost."""
    import redis as redis_py
    from hycache_dht.redis_store import RedisClusterStore

    user, password = f"acl-{dht_namespace}", "acl-password-0123456789"
    admins = [redis_py.Redis(host=h, port=p) for h, p in redis_cluster.nodes]
    for r in admins:
        r.execute_command("ACL", "SETUSER", user, "on", f">{password}", "resetkeys", f"~{dht_namespace}:*",
                          *DEPLOYED_RULES)
    store = RedisClusterStore(redis_cluster.nodes, namespace=dht_namespace, username=user, password=password,
                              op_timeout=30.0)
    try:
        res = store.apply([Op.create(b"/acl", D), Op.put(b"/acl/a", F(size=3)), Op.acquire(b"/acl/a", "n1", 30),
                           Op.create(b"/acl/b", F(size=4))])
        assert res[0] is True and isinstance(res[1], int) and res[2] is True and res[3] is True, res
        assert store.get(b"/acl/a").size == 3 and store.get(b"/acl/b").size == 4
        assert store.get(b"/acl/a").writer == "n1"
        assert store.apply([Op.delete(b"/acl/b")])[0] is True
        assert store.get(b"/acl/b") is None
    finally:
        store.close()
        for r in admins:
            r.execute_command("ACL", "DELUSER", user)
            r.close()


def test_huge_directory_create_stays_o1(store, engine, capsys):
    """100k entries in one directory: per-create time at 1k vs 100k entries (printed),
    listing streams them all."""
    n = 100_000
    store.create(b"/big", D)

    def fill(lo: int, hi: int) -> None:
        for s in range(lo, hi, 2000):
            res = store.apply([Op.create(b"/big/f%07d" % i, F(size=i)) for i in range(s, min(hi, s + 2000))])
            assert all(r is True for r in res)

    def timed(lo: int, k: int = 300) -> float:
        t0 = time.perf_counter()
        for i in range(lo, lo + k):
            assert store.create(b"/big/f%07d" % i, F(size=i))
        return (time.perf_counter() - t0) / k

    fill(0, 1000)
    small = timed(1000)
    fill(1300, n - 300)
    big = timed(n - 300)
    t0 = time.perf_counter()
    it = store.list_dir(b"/big")
    first = next(it)
    t_first = time.perf_counter() - t0
    names = {first[0]} | {name for name, _ in it}
    t_all = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\n[{engine}] create at 1k entries: {small * 1e6:.0f} us, at 100k: {big * 1e6:.0f} us"
              f" (x{big / small:.2f}); list_dir first entry {t_first * 1e3:.1f} ms, all {n} in"
              f" {t_all:.2f} s")
    assert len(names) == n and b"f0099999" in names
    assert big < 10 * small  # O(1): a small factor, not 100x
    assert t_first < t_all / 5  # streamed, not loaded whole
    assert store.get(b"/big/f0050000").size == 50000


# -- crashes ------------------------------------------------------------------------------


class Crash(BaseException):
    """Raised from the step hook: the process 'dies' after that step (BaseException, so no
    cleanup code that catches Exception runs)."""


def _dry_run(store, op):
    """Run ``op()`` recording the protocol steps it reports: (steps, op's result)."""
    steps: list[str] = []
    store.step_hook = steps.append
    result = op()
    store.step_hook = None
    return steps, result


def _crash_at(store, i: int, op) -> dict:
    """Run ``op()`` until its protocol step ``i`` (from 0), where the process 'dies'; then
    repair with ``fsck`` and return its report."""
    calls = itertools.count()

    def hook(name):
        if next(calls) == i:
            raise Crash(name)

    store.step_hook = hook
    with pytest.raises(Crash):
        op()
    store.step_hook = None
    return store.fsck(repair=True)


RENAME_CASES = {
    # name: (make source, make destination or None, src, dst)
    "file-across": ("file", None),
    "file-replace": ("file", "file"),
    "dir-across": ("dir", None),
    "dir-same-parent": ("dir", "same"),
    "dir-replace-empty": ("dir", "emptydir"),
}


def _setup_rename(store, base: bytes, case: str) -> tuple[bytes, bytes, dict | None]:
    kind, dst_kind = RENAME_CASES[case]
    store.create(base, D)
    store.create(base + b"/from", D)
    store.create(base + b"/to", D)
    src = base + b"/from/item"
    dst = base + (b"/from/renamed" if dst_kind == "same" else b"/to/item")
    if kind == "file":
        store.create(src, F(size=42))
    else:
        _make_tree(store, src, depth=3, files=2)
    if dst_kind == "file":
        store.create(dst, F(size=7))
    elif dst_kind == "emptydir":
        store.create(dst, dir_meta(0o700))
    return src, dst, tree(store, dst)


@pytest.mark.parametrize("case", list(RENAME_CASES))
def test_rename_crash_at_every_step_then_fsck(open_store, case):
    store = open_store()
    src, dst, _ = _setup_rename(store, b"/dry", case)
    steps, _ = _dry_run(store, lambda: store.rename(src, dst))
    assert steps, "the engine reports no protocol steps"
    outcomes = set()
    for i, step in enumerate(steps):
        base = b"/crash%d" % i
        src, dst, dst_before = _setup_rename(store, base, case)
        src_before = tree(store, src)
        rep = _crash_at(store, i, lambda: store.rename(src, dst))
        at_src, at_dst = tree(store, src), tree(store, dst)
        if at_src is not None:  # rolled back: both names as before
            assert at_src == src_before, (step, rep)
            assert at_dst == dst_before, (step, rep)
            outcomes.add("back")
        else:  # rolled forward: everything under the new name, nothing lost
            assert at_dst == src_before, (step, rep)
            outcomes.add("forward")
        clean = store.fsck()
        assert clean["problems"] == 0, (step, clean)
        # and the namespace keeps working there
        top = dst if at_src is None else src
        if src_before[b""][0] == "dir":
            assert store.create(top + b"/after-crash", F())
    assert "forward" in outcomes
    print(f"{case}: {len(steps)} steps {steps} -> {sorted(outcomes)}")


def test_rmdir_crash_at_every_step_then_fsck(open_store):
    store = open_store()
    store.create(b"/rm", D)
    store.create(b"/rm/dry", D)
    store.create(b"/rm/dry/x", F())
    store.delete(b"/rm/dry/x")
    steps, removed = _dry_run(store, lambda: store.delete(b"/rm/dry"))
    assert removed
    for i in range(len(steps)):
        d = b"/rm/d%d" % i
        store.create(d, D)
        _crash_at(store, i, lambda: store.delete(d))
        assert store.fsck()["problems"] == 0
        if store.get(d) is not None:  # kept: still a working directory
            assert store.create(d + b"/y", F()) and store.delete(d + b"/y")
        assert store.create(d, D) in (True, False)
        assert store.create(d + b"/z", F())  # whatever happened, the path works again


def test_mkdir_crash_at_every_step_then_fsck(open_store):
    store = open_store()
    steps, created = _dry_run(store, lambda: store.create(b"/dry", D))
    assert created
    for i in range(len(steps)):
        d = b"/mk%d" % i
        _crash_at(store, i, lambda: store.create(d, D))
        assert store.fsck()["problems"] == 0
        assert store.get(d) is not None  # the entry was written first: it stays a directory
        assert store.create(d + b"/x", F()) and [n for n, _ in store.list_dir(d)] == [b"x"]


def test_fsck_takes_over_only_expired_intents(open_store, engine):
    """A rename whose process died is repaired by another client's fsck, but only after its
    deadline: a live rename is never 'repaired' under its feet."""
    kw = {"intent_timeout": 1.0} if engine == "redis" else {}
    a = open_store(**kw)
    src, dst, _ = _setup_rename(a, b"/t", "dir-across")
    before = tree(a, src)

    crash_at = "copy" if engine == "redis" else "rekey"  # both: after the destination

    def hook(name):
        if name == crash_at:
            raise Crash(name)

    a.step_hook = hook
    with pytest.raises(Crash):
        a.rename(src, dst)
    a.step_hook = None
    b = open_store(**kw)
    if engine == "redis":
        rep = b.fsck(repair=True)
        assert rep["busy"] >= 1 and rep["rolled_forward"] == 0, rep  # a's deadline not reached
        assert a.get(src) is not None and a.get(dst) is not None  # mid-rename: both visible
        time.sleep(1.2)
        rep = b.fsck(repair=True)
        assert rep["rolled_forward"] == 1, rep
        assert a.get(src) is None and tree(a, dst) == before, rep
    else:  # the transaction never committed
        assert b.fsck(repair=True)["problems"] == 0
        assert a.get(dst) is None and tree(a, src) == before
    assert b.fsck()["problems"] == 0


def test_errors_are_typed(store):
    assert issubclass(DHTError, Exception)
    with pytest.raises(FileNotFoundError):
        store.rename(b"/no", b"/where")
