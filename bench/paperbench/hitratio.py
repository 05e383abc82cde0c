"""The hit-ratio row (issue 31; journal §7.5, heuristic vs LRU): per policy, the simulator's
predicted hit ratio and the one measured live on a HyCache mount, for the same trace.

The trace: ``refs`` reads of ``files`` files with Zipf(``alpha``) popularity (seeded), file
sizes of four kinds (1-4 units) independent of popularity, the whole set about twice the
fast tier.  A *hit* is, on both sides, an open for reading that finds the file's bytes on
the fast tier (the papers count whole-file accesses; the agent's ``counters.fast.hits`` and
``counters.misses``: a promotion the open waits for is a miss).

Live, one agent per policy, each on a fresh fast tier of ``fast_bytes`` and a slow tier on
the HyCache target's HDD model; the files are written through the mount, demoted (the
trace starts with an empty fast tier, as the simulation does), and read in trace order,
one whole file per reference, the agents interleaved (reference i on every agent, in a
rotated order, before reference i + 1: background load falls on all policies alike).  The page cache is kept out per file (``drop_caches`` per
reference took ~1-2 s on this shared machine): before each reference every blob of both
tiers is fadvised ``DONTNEED`` (clean pages dropped; the HDD model's loop device uses
direct I/O, so nothing lies below), and the reader drops its file's pages on the mount
before closing it.

* An online policy (``--policy``: every one the agent offers) runs as the agent runs it
  with ``--promote-mode before-open`` (the papers' Algorithm 1: an opened slow-tier file is
  promoted before the open returns, if the admission rule takes it) and watermarks 1.0/0.9
  (room is made at each promotion, the evictor never wakes).  The simulator predicts it
  with ``admission="agent"``, seeded with the opens that created the files.
* The heuristic (Algorithms 4-5) sees the future, so it is a plan, not an agent policy:
  its steps (``plan_heuristic``, the control plane's layer 2) are carried out by this row
  through the agent's ``user.hycache.tier`` control — after a reference the plan fetches,
  its victims are demoted and the file promoted, waited for and timed — on an agent with
  ``--no-promote-on-open``.

Seconds: per policy, the sum over the references of open + read + close (+ the plan's
moves for the heuristic) + a ``syncfs`` of both tiers (the writes a reference caused, e.g.
an eviction's copy to the HDD model, are billed to it, not to the next agent's reference);
the page-cache drops are not in it.  With the HDD model, its device's bytes read and
written during each policy's references are counted too (``slow_read_mb``,
``slow_written_mb``): the part of the time that does not depend on the machine's load."""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from hycache_core.policies import available_policies, plan_heuristic
from hycache_core.sim import SimOptions, Trace, simulate
from hycache_harness import Agent, drop_caches, wait_for

from .targets import Target

Tick = Callable[[str], None]
CACHES = ("drop_caches before the replay; before each reference (not timed) every blob of both tiers is "
          "fadvised DONTNEED, and the reader drops the mount's pages of its file before closing it; each reference "
          "opens, reads whole and closes one file; a hit is an open that finds the bytes on the fast tier")
HIT = ("an open for reading that finds the file's bytes on the fast tier (agent: counters.fast.hits; a miss: "
       "counters.misses, a promotion the open waits for included); simulator: a reference to a resident file")
TIER = "user.hycache.tier"
CHUNK = 1 << 20
TOLERANCE = 0.10


def policies() -> list[str]:
    """Every policy the agent's ``--policy`` offers, then the planned heuristic."""
    return [*available_policies(), "heuristic"]


def make_trace(fast_bytes: int, files: int, refs: int, seed: int, alpha: float = 0.9) -> Trace:
    """Zipf(``alpha``) reads of ``files`` files of 1-4 units each, the set ~2x ``fast_bytes``."""
    rng = np.random.default_rng(seed)
    unit = max(4096, int(2 * fast_bytes / (2.5 * files)) // 4096 * 4096)
    sizes = [unit * (1 + i % 4) for i in range(files)]
    rank = rng.permutation(files)  # popularity independent of size
    weights = np.arange(1, files + 1, dtype=np.float64) ** -alpha
    picks = rng.choice(files, size=refs, p=weights / weights.sum())
    trace = Trace()
    for i in range(files):
        trace.key_of(f"f{i:04d}")
    for p in picks:
        trace.append(f"f{int(rank[p]):04d}", sizes[int(rank[p])])
    return trace


def predict(trace: Trace, fast_bytes: int, policy: str) -> dict:
    """The simulator's hit ratio for ``policy`` (files created in name order, one open each)."""
    usage = {k: (1, k + 1) for k in range(len(trace.names))}
    r = simulate(trace, fast_bytes, [policy], options=SimOptions(usage=usage)).results[policy]
    return {"hits": r.stats.hits, "refs": r.stats.refs, "hit_ratio": r.stats.hits / r.stats.refs,
            "declined": r.extra.get("declined", 0), "admissions": r.stats.admissions,
            "evictions": r.stats.evictions, "slow_read_mb": r.stats.slow_bytes_read / 1e6}


def _counts(agent: Agent) -> dict[str, int]:
    """The agent's hits and misses (opens for reading), its declined promotions and the
    bytes its migrations moved."""
    st = agent.status()
    c = st["counters"]
    return {"hits": int(c["fast"]["hits"]), "misses": int(c["misses"]),
            "declined": int(st["migrations"].get("promotions_declined", 0)),
            "promoted_bytes": int(c["promoted_bytes"]), "evicted_bytes": int(c["evicted_bytes"])}


def _read(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        while os.read(fd, CHUNK):
            pass
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the mount's pages of the file
    finally:
        os.close(fd)


def _drop_blobs(dirs: tuple[Path, ...]) -> None:
    """Drop the clean cached pages of every file under ``dirs`` (the tiers' blobs)."""
    for d in dirs:
        for top, _dirs, names in os.walk(d):
            for n in names:
                try:
                    fd = os.open(os.path.join(top, n), os.O_RDONLY | os.O_NOATIME)
                except OSError:  # a blob renamed or removed meanwhile
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)


def _syncfs(path: Path) -> None:
    """Write back the dirty pages of the file system holding ``path`` (syncfs(2))."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), f"syncfs {path}")
    finally:
        os.close(fd)


def _move(paths: list[Path], tier: str) -> None:
    """Move files through the agent's ``user.hycache.tier`` control and wait for them."""
    for p in paths:
        os.setxattr(p, TIER, tier.encode())
    wait_for(lambda: all(os.getxattr(p, TIER) == tier.encode() for p in paths), timeout=300,
             what=f"moves to {tier}", interval=0.002)


def _populate(agent: Agent, trace: Trace) -> list[Path]:
    size = {k: s for k, s in zip(trace.keys, trace.sizes, strict=True)}
    paths = []
    for k, name in enumerate(trace.names):
        p = agent.mnt / name
        p.write_bytes(os.urandom(size.get(k, 4096)))
        paths.append(p)
    os.sync()
    agent.cli("demote", "--timeout", "600", *map(str, paths))
    return paths


class Replay:
    """One policy's agent and its replay of the trace, one reference at a time."""

    def __init__(self, trace: Trace, fast_bytes: int, policy: str, root: Path, slow: Path,
                 device: Callable[[], tuple[int, int]] | None = None) -> None:
        self.trace, self.policy, self.root, self.slow, self.device = trace, policy, root, slow, device
        self.device_bytes = [0, 0]  # the slow device's (read, written) bytes during this policy's references
        self.planned = policy == "heuristic"
        opts: dict[str, object] = {"high_watermark": 1.0, "low_watermark": 0.9}
        extra: tuple[str, ...] = ("--no-promote-on-open",) if self.planned else ()
        if not self.planned:
            opts["policy"], opts["promote_mode"] = policy, "before-open"
        for d in (root / "fast", slow):
            d.mkdir(parents=True, exist_ok=True)
        self.agent = Agent(root, f"hitratio-{policy}", *extra, fast=root / "fast", slow=slow,
                           fast_capacity=fast_bytes, log=root.parent / f"hitratio-{policy}.log", **opts)
        refs = list(zip(trace.keys, trace.sizes, strict=True))
        self.steps = plan_heuristic(refs, fast_bytes) if self.planned else []
        self.paths: list[Path] = []
        self.seconds = 0.0
        self.before: dict = {}

    def start(self) -> None:
        """Mount, write the files through the mount and demote them all."""
        self.agent.start(timeout=60)
        self.paths = _populate(self.agent, self.trace)
        self.before = _counts(self.agent)

    def step(self, i: int) -> None:
        """Reference ``i``: read its file whole (then carry out the plan's step), timed."""
        key = self.trace.keys[i]
        _drop_blobs((self.root / "fast", self.slow))
        d0 = self.device() if self.device else (0, 0)
        t0 = time.perf_counter()
        _read(self.paths[key])
        if self.planned and self.steps[i].action == "fetch":
            if self.steps[i].evict:
                _move([self.paths[int(v)] for v in self.steps[i].evict], "slow")
            _move([self.paths[key]], "fast")
        _syncfs(self.slow)
        _syncfs(self.root / "fast")
        self.seconds += time.perf_counter() - t0
        if self.device:
            d1 = self.device()
            self.device_bytes[0] += d1[0] - d0[0]
            self.device_bytes[1] += d1[1] - d0[1]

    def result(self) -> dict:
        now = _counts(self.agent)
        d = {k: now[k] - self.before[k] for k in now}
        hits, misses, declined = d.pop("hits"), d.pop("misses"), d.pop("declined")
        out = {"hits": hits, "refs": hits + misses, "hit_ratio": hits / max(1, hits + misses), "declined": declined,
               "seconds": self.seconds, **{k.replace("_bytes", "_mb"): v / 1e6 for k, v in d.items()}}
        if self.device:
            out["slow_read_mb"], out["slow_written_mb"] = self.device_bytes[0] / 1e6, self.device_bytes[1] / 1e6
        return out

    def stop(self) -> None:
        self.agent.stop(timeout=60)


def live(trace: Trace, fast_bytes: int, policies: list[str], work: Path, slow: Callable[[str], Path],
         tick: Tick = lambda _what: None, device: Callable[[], tuple[int, int]] | None = None) -> dict[str, dict]:
    """Replay ``trace`` on one fresh agent per policy (root ``work/hr-<policy>``, slow tier
    ``slow(policy)``), interleaved: reference ``i`` is replayed on every agent, in an order
    rotated at each reference, before reference ``i + 1``, so the machine's background load
    falls on every policy alike.  ``device``: the slow device's (read, written) bytes so
    far, if there is one.  Live hits, seconds and bytes moved, per policy."""
    replays: list[Replay] = []
    try:
        for p in policies:
            replays.append(Replay(trace, fast_bytes, p, work / f"hr-{p}", slow(p), device))
            replays[-1].start()
        drop_caches()
        for i in range(len(trace)):
            k = i % len(replays)
            for r in replays[k:] + replays[:k]:
                r.step(i)
        out = {r.policy: r.result() for r in replays}
        for p in policies:
            tick(f"hitratio {p}")
        return out
    finally:
        for r in replays:
            r.stop()


def row(targets: list[Target], fast_bytes: int, files: int, refs: int, seed: int, tick: Tick,
        names: list[str] | None = None) -> dict:
    """Predicted and live hit ratios and live seconds, per policy (on the hycache target's HDD model)."""
    hyc = next((t for t in targets if t.name == "hycache"), None)
    if hyc is None or hyc.hdd is None:
        raise RuntimeError("the hitratio row needs the hycache target")
    hdd = hyc.hdd
    work = hyc.dir.parent.parent  # the target's agent root's parent: the run's directory
    trace = make_trace(fast_bytes, files, refs, seed)
    names = names or policies()
    out: dict = {"fast_bytes": fast_bytes, "files": files, "refs": refs, "seed": seed,
                 "set_bytes": sum(dict(zip(trace.keys, trace.sizes, strict=True)).values()),
                 "tolerance": TOLERANCE, "slow_tier": hdd.describe(), "hit": HIT, "caches": CACHES,
                 "policies": {}}
    got = live(trace, fast_bytes, names, work, lambda p: hdd.share(f"hitratio-{p}"), tick,
               lambda: (hdd.read_bytes(), hdd.write_bytes()))
    for p in names:
        pred = predict(trace, fast_bytes, p)
        if got[p]["refs"] != len(trace):
            raise RuntimeError(f"hitratio {p}: the agent counted {got[p]['refs']} opens for {len(trace)} references")
        rel = abs(got[p]["hit_ratio"] - pred["hit_ratio"]) / pred["hit_ratio"] if pred["hit_ratio"] else None
        out["policies"][p] = {"predicted": pred, "live": got[p], "rel_diff": rel}
    return out


def table(r: dict) -> list[str]:
    """The row's Markdown table."""
    head = ("| policy | predicted hit ratio | live hit ratio | relative difference | live seconds | "
            "declined promotions (simulator / live) | slow device MB read / written (live) | "
            "slow MB read (simulator) |")
    lines = [f"Hit ratio, predicted vs live: {r['refs']} Zipf reads of {r['files']} files "
             f"({r['set_bytes'] / 2**20:,.0f} MiB) through a {r['fast_bytes'] / 2**20:,.0f} MiB fast tier",
             "", head, "|---|---|---|---|---|---|---|---|"]
    for p, v in r["policies"].items():
        rel = "-" if v["rel_diff"] is None else f"{100 * v['rel_diff']:.1f} %"
        live = v["live"]
        dev = f"{live['slow_read_mb']:,.0f} / {live['slow_written_mb']:,.0f}" if "slow_read_mb" in live else "-"
        lines.append(f"| {p} | {v['predicted']['hit_ratio']:.3f} | {live['hit_ratio']:.3f} | {rel} | "
                     f"{live['seconds']:.1f} | {v['predicted']['declined']} / {live.get('declined', '-')} | {dev} | "
                     f"{v['predicted']['slow_read_mb']:,.0f} |")
    return lines


def figure(plt, r: dict, path: Path) -> Path:
    """Predicted vs live hit ratio per policy, and the live seconds."""
    names = list(r["policies"])
    x = np.arange(len(names))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax.bar(x - 0.2, [r["policies"][p]["predicted"]["hit_ratio"] for p in names], 0.4, label="simulator")
    ax.bar(x + 0.2, [r["policies"][p]["live"]["hit_ratio"] for p in names], 0.4, label="live on the mount")
    ax.set_xticks(x, names)
    ax.set_ylabel("hit ratio (opens on the fast tier)")
    ax.set_title(f"set {r['set_bytes'] / r['fast_bytes']:.1f}x the fast tier, Zipf reads")
    ax.legend(fontsize=8, loc="lower right")
    ax2.bar(names, [r["policies"][p]["live"]["seconds"] for p in names], color="C2")
    ax2.set_ylabel("live seconds (reads, the plan's moves, syncs)")
    ax2.set_title("heuristic vs online policies (journal §7.5)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
