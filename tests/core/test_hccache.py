"""HCCache as a data structure: Algorithms 1-3, CAS with forced collisions, the bloom
filter's false-positive rate, the byte bound, versions, metrics; hypothesis against a
dict model."""

from __future__ import annotations

import random

import pytest
from hycache_core.hccache import CHUNK_OVERHEAD, ENTRY_OVERHEAD, HCCache
from hypothesis import given, settings
from hypothesis import strategies as st
from rbloom import Bloom

KB = 1024


def test_small_file_is_one_group_moved_and_evicted_whole():
    c = HCCache(10 * KB * 10, mode="hybrid", small_file=8 * KB, block_size=1 * KB)
    # Algorithm 1: lazy allocation, blocks of a small file join one LRU entry
    assert c.insert("s", 1, 4 * KB, 0, b"a" * KB)
    assert c.memory_bytes == KB + CHUNK_OVERHEAD + ENTRY_OVERHEAD
    assert c.insert("L", 1, 64 * KB, 0, b"L" * KB)
    assert c.insert("s", 1, 4 * KB, 2, b"c" * KB)
    assert list(c.lru) == [("L", 0), ("s", None)]  # the group moved to the MRU end
    assert c.abd() == 1.0  # its two blocks are adjacent in the block-expanded list
    # Algorithm 2: a hit on one block moves the whole group
    c.insert("L", 1, 64 * KB, 1, b"M" * KB)
    assert c.lookup("s", 1, 4 * KB, 2) == b"c" * KB
    assert list(c.lru)[-1] == ("s", None)
    assert c.lookup("s", 1, 4 * KB, 1) is None  # never inserted: a miss
    # Algorithm 3: evicting a block of a small file removes the whole group
    assert c.evict("s", 0)
    assert c.lookup("s", 1, 4 * KB, 2) is None
    assert not c.evict("s", 0)  # NON EXIST
    assert c.evict("L", 0) and c.lookup("L", 1, 64 * KB, 1) == b"M" * KB


def test_block_mode_interleaves_small_files():
    c = HCCache(1 << 20, mode="block", small_file=8 * KB, block_size=1 * KB)
    c.insert("s", 1, 3 * KB, 0, b"a" * KB)
    c.insert("t", 1, 3 * KB, 0, b"b" * KB)
    c.insert("s", 1, 3 * KB, 1, b"c" * KB)
    assert list(c.lru) == [("s", 0), ("t", 0), ("s", 1)]
    assert c.abd() == 2.0
    c.lookup("s", 1, 3 * KB, 0)
    assert list(c.lru)[-1] == ("s", 0)  # only that block moves
    assert c.insert_object("u", 1, b"x" * 2500) and ("u", 2) in c.lru  # objects become blocks


def test_lru_eviction_order_and_strict_bound():
    per = KB + CHUNK_OVERHEAD + ENTRY_OVERHEAD
    c = HCCache(3 * per, small_file=0, block_size=KB)  # everything large
    for j in range(3):
        assert c.insert("L", 1, 10 * KB, j, bytes([j]) * KB)
    c.lookup("L", 1, 10 * KB, 0)
    assert c.insert("L", 1, 10 * KB, 3, b"\3" * KB)
    assert c.lookup("L", 1, 10 * KB, 1) is None  # the oldest went
    assert c.lookup("L", 1, 10 * KB, 0) == b"\0" * KB
    assert c.memory_bytes <= c.limit_bytes
    assert not c.insert("big", 1, 100 * KB, 0, b"z" * (4 * per))  # can never fit
    assert c.memory_bytes <= c.limit_bytes


def test_version_change_drops_entries():
    c = HCCache(1 << 20)
    c.insert_object("f", (1, "e1"), b"old")
    assert c.lookup_object("f", (1, "e1"), 3) == b"old"
    assert c.lookup_object("f", (2, "e2"), 3) is None  # another version: dropped
    assert c.lookup_object("f", (1, "e1"), 3) is None
    c.insert_object("f", (2, "e2"), b"new")
    assert c.invalidate("f", (3, "e3")) and c.lookup_object("f", (2, "e2"), 3) is None
    assert c.stats()["invalidations"] == 2
    assert c.memory_bytes == 0


def test_dedup_shares_identical_content_and_survives_forced_collisions():
    c = HCCache(1 << 20, hash_fn=lambda data: b"same")  # every content collides
    c.insert_object("a", 1, b"hello")
    c.insert_object("b", 1, b"hello")  # identical: stored once
    c.insert_object("x", 1, b"world")  # same hash, different bytes: stored apart
    assert c.lookup_object("a", 1, 5) == b"hello"
    assert c.lookup_object("b", 1, 5) == b"hello"
    assert c.lookup_object("x", 1, 5) == b"world"
    s = c.stats()
    assert s["cas_chunks"] == 2 and s["hash_collisions"] == 1 and s["dedup_saved_bytes"] == 5
    c.invalidate("a")
    assert c.lookup_object("b", 1, 5) == b"hello"  # still referenced by b
    c.invalidate("b")
    assert c.lookup_object("x", 1, 5) == b"world"
    assert c.stats()["cas_chunks"] == 1


def test_large_file_blocks_dedup_per_block():
    c = HCCache(1 << 20, small_file=KB, block_size=KB)
    for j in range(4):
        c.insert("L", 1, 4 * KB, j, b"\0" * KB)
    assert c.stats()["cas_chunks"] == 1 and c.stats()["dedup_saved_bytes"] == 3 * KB


def test_bloom_filter_false_positive_rate():
    b = Bloom(10_000, 0.01)
    for i in range(10_000):
        b.add(("present", i))
    fp = sum(("absent", i) in b for i in range(100_000)) / 100_000
    assert all(("present", i) in b for i in range(10_000))
    assert fp < 0.02, fp
    c = HCCache(1 << 20)
    assert c.lookup_object("nothing", 1, 1) is None and c.bloom_negatives == 1


def test_metrics_follow_the_definitions():
    c = HCCache(1 << 20, small_file=0, block_size=10)
    c.insert("f", 1, 30, 0, b"a" * 10)
    c.insert("f", 1, 30, 1, b"b" * 10)
    c.record_request(0.5, 20, client="p1")
    c.record_request(1.5, 10, client="p2")
    c.record_request(0.5, 10, client="p2")
    assert c.ecdal() == pytest.approx(1 / ((0.5 + 1.5 + 0.5) * 20))
    assert c.ecdab() == pytest.approx(40 / (2.0 * 20))
    assert c.lookup("f", 1, 30, 0) and c.lookup("f", 1, 30, 2) is None
    c.account(20, 10)
    s = c.stats()
    assert s["hit_ratio"] == 0.5 and s["byte_hit_ratio"] == 0.5


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="mode"):
        HCCache(1, mode="lru")
    with pytest.raises(ValueError, match="block_size"):
        HCCache(1, block_size=0)


ops = st.lists(st.tuples(
    st.sampled_from(["insert", "lookup", "object", "getobj", "evict", "invalidate"]),
    st.sampled_from(["a", "b", "c", "d"]),   # file
    st.integers(1, 2),                        # version
    st.integers(0, 5),                        # block
    st.sampled_from([b"", b"x", b"y" * 7, b"z" * 16, b"x" * 16]),
), max_size=60)


def content(f: str, v: int, size: int) -> bytes:
    return (f"{f}{v}-".encode() * size)[:size]


@settings(max_examples=300, deadline=None)
@given(ops, st.sampled_from(["hybrid", "block"]), st.integers(0, 3000), st.booleans())
def test_against_a_dict_model(program, mode, limit, collide):
    """Whatever the cache answers is what was last inserted for that file, block and
    version (a dict model that never forgets); the bound always holds."""
    hash_fn = (lambda d: b"h") if collide else (lambda d: bytes([len(d) % 3]))
    c = HCCache(limit, mode=mode, small_file=40, block_size=16, hash_fn=hash_fn)
    sizes = {"a": 20, "b": 30, "c": 100, "d": 200}
    model: dict[tuple, bytes] = {}
    objects: dict[tuple, bytes] = {}
    current: dict[str, int] = {}
    rnd = random.Random(0)
    for op, f, v, j, data in program:
        size = sizes[f]
        if op in ("insert", "lookup", "object", "getobj") and current.get(f) not in (None, v):
            # any operation with a new version forgets the old one
            model = {k: d for k, d in model.items() if k[0] != f}
            objects = {k: d for k, d in objects.items() if k[0] != f}
        if op == "insert":
            # a version's content never changes: block j of (f, v) is always the same bytes
            # (the cache keeps the first copy of a block it is given again)
            data = content(f, v, size)[j * 16:(j + 1) * 16] or bytes([rnd.randrange(3)])
            c.insert(f, v, size, j, data)
            model[(f, v, j)] = data
            objects.pop((f, v), None)
            current[f] = v
        elif op == "object":
            # a whole object is the file's content at this version (one size, the same
            # bytes as its blocks)
            data = content(f, v, size)
            c.insert_object(f, v, data)
            objects[(f, v)] = data
            if c.is_small(len(data)):  # the whole object replaces the group
                for k in [k for k in model if k[0] == f]:
                    del model[k]
            else:  # inserted block by block over what was there
                for b in range(max(1, -(-len(data) // 16))):
                    model[(f, v, b)] = data[b * 16:(b + 1) * 16]
                objects.pop((f, v), None)
            current[f] = v
        elif op == "lookup":
            got = c.lookup(f, v, size, j)
            current[f] = v
            if got is not None:
                whole = objects.get((f, v))
                # without a whole object in the model: the block last inserted, or the
                # version's content (served from its whole object, which the cache may keep
                # when a block of the same version arrives; empty past the end of the file)
                allowed = ({whole[j * 16:(j + 1) * 16]} if whole is not None
                           else {model.get((f, v, j)), content(f, v, size)[j * 16:(j + 1) * 16]})
                assert got in allowed
        elif op == "getobj":
            got = c.lookup_object(f, v, size)
            current[f] = v
            if got is not None:
                # a version's whole object is its content, whatever blocks of it came since
                # (the cache may keep the object when a block of the same version arrives)
                assert got == objects.get((f, v), content(f, v, size))
        elif op == "evict":
            c.evict(f, j)
        elif op == "invalidate":
            c.invalidate(f)
            model = {k: d for k, d in model.items() if k[0] != f}
            objects = {k: d for k, d in objects.items() if k[0] != f}
            current.pop(f, None)
        assert c.memory_bytes <= limit
        assert c.memory_bytes == c.pool.stored_bytes + len(c.lru) * ENTRY_OVERHEAD
        assert set(k for k, _ in c.lru) == set(c.groups)
