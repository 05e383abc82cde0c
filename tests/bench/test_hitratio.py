"""The papers' hitratio row (issue 31, journal §7.5): the simulator's predicted hit ratio
and the one measured live on a real mount agree for the same trace, per policy."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hycache_harness import fuse_unusable_reason
from paperbench import hitratio


def test_the_trace_is_seeded_skewed_and_twice_the_fast_tier() -> None:
    a = hitratio.make_trace(16 << 20, files=12, refs=200, seed=5)
    b = hitratio.make_trace(16 << 20, files=12, refs=200, seed=5)
    assert (a.keys, a.sizes) == (b.keys, b.sizes)
    sizes = dict(zip(a.keys, a.sizes, strict=True))
    assert len(set(sizes.values())) > 1  # files of several sizes
    assert 1.6 <= sum(sizes.values()) / (16 << 20) <= 2.4 or len(sizes) < 12
    counts = sorted((a.keys.count(k) for k in set(a.keys)), reverse=True)
    assert counts[0] >= 3 * counts[-1]  # Zipf: the most popular file is read far more often


def _unusable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (drop_caches, FUSE)"
    return fuse_unusable_reason()


@pytest.mark.mount
@pytest.mark.slow
@pytest.mark.skipif(_unusable() is not None, reason=str(_unusable()))
def test_live_hit_ratios_are_within_the_tolerance_of_the_predictions() -> None:
    fast = 16 << 20
    trace = hitratio.make_trace(fast, files=12, refs=60, seed=7)
    work = Path(tempfile.mkdtemp(prefix="hr-", dir="/var/tmp"))  # short: the agents' control sockets are in it
    try:
        got = hitratio.live(trace, fast, ["lru", "heuristic"], work, lambda p: work / f"slow-{p}")
        mounted = [p for p in work.glob("hr-*/mnt") if os.path.ismount(p)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert mounted == []  # every agent unmounted
    for policy in ("lru", "heuristic"):
        pred = hitratio.predict(trace, fast, policy)
        assert got[policy]["refs"] == len(trace)  # every reference counted once, as a hit or a miss
        assert 0 < pred["hit_ratio"] < 1  # the set does not fit: the policy's choices matter
        assert abs(got[policy]["hit_ratio"] - pred["hit_ratio"]) <= hitratio.TOLERANCE * pred["hit_ratio"], \
            (policy, pred, got[policy])
        assert got[policy]["seconds"] > 0
    # the same admission decisions: every miss LRU declined live, the simulator declined
    assert got["lru"]["declined"] == hitratio.predict(trace, fast, "lru")["declined"] > 0
