"""Periodic rebalance (HyCache+: local writes give no load balance, so hot spots are
rebalanced periodically).

Every node publishes its fast tier's usage with its heartbeat. Every ``interval`` seconds
a node checks itself: its fast tier is *hot* when its usage has stayed at or above the low
watermark for ``rounds`` checks in a row (the evictor is keeping it full: what it evicts
next goes to the slow device). A peer is *cold* when its usage is below half its low
watermark. A hot node then hands its next eviction victims (closed, unpinned files, in
the policy's order) to cold peers instead of demoting them to its own slow tier: it asks
each peer, through its inbox, to *adopt* a file, and the peer takes it over (fetches the
bytes into its fast tier, becomes the primary; the hot node drops its copy when told).
It moves enough bytes to bring itself to the cluster's mean usage (at least down to half
its low watermark), within each peer's room below its own low watermark, and at most
``MAX_BYTES_PER_ROUND`` per round. A peer that filled up meanwhile refuses (logged).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

import trio

from hycache_agent.fs.namespace import FsError

log = logging.getLogger(__name__)

MAX_BYTES_PER_ROUND = 1 << 30
MAX_FILES_PER_ROUND = 256


@dataclass
class RebalanceStats:
    checks: int = 0
    hot_rounds: int = 0
    rounds_acted: int = 0
    handed_over_files: int = 0
    handed_over_bytes: int = 0
    adopted_files: int = 0
    adopted_bytes: int = 0
    refused: int = 0
    last_round: float | None = None


class Rebalancer:
    def __init__(self, link, *, interval: float, rounds: int = 3) -> None:
        self.link = link
        self.engine = link.engine
        self.interval = interval
        self.rounds = rounds
        self.stats = RebalanceStats()

    def load(self) -> dict:
        """What the heartbeat publishes about this node's fast tier."""
        cfg = self.engine.config
        return {"fast_used": self.engine.fast_used, "capacity": self.engine.capacity,
                "low": cfg.low_watermark, "high": cfg.high_watermark}

    @staticmethod
    def fraction(load: dict) -> float:
        return load["fast_used"] / max(1, load["capacity"])

    async def run(self) -> None:
        if self.interval <= 0:
            return
        while True:
            await trio.sleep(self.interval)
            if self.link.reachable:
                try:
                    await self.check()
                except FsError as exc:
                    log.warning("rebalance round skipped: %s", exc)

    async def check(self) -> int:
        """One periodic check; returns the number of files handed to other nodes."""
        self.stats.checks += 1
        mine = self.load()
        if self.fraction(mine) < mine["low"]:
            self.stats.hot_rounds = 0
            return 0
        self.stats.hot_rounds += 1
        if self.stats.hot_rounds < self.rounds:
            return 0
        nodes = self.link.known_nodes  # refreshed by every heartbeat
        peers = {n: d["load"] for n, d in nodes.items()
                 if d["alive"] and n != self.link.node_id and d.get("load")}
        cold = {n: ld for n, ld in peers.items() if self.fraction(ld) < ld["low"] / 2}
        if not cold:
            return 0
        fractions = [self.fraction(mine), *(self.fraction(ld) for ld in peers.values())]
        target = max(sum(fractions) / len(fractions), mine["low"] / 2) * mine["capacity"]
        budget = min(mine["fast_used"] - target, MAX_BYTES_PER_ROUND)
        room = {n: ld["low"] * ld["capacity"] - ld["fast_used"] for n, ld in cold.items()}
        plan: list[tuple[str, bytes, int]] = []
        # the policy's next victims (bounded: the loop thread must not walk every file)
        for inode in itertools.islice(self.engine.eviction_candidates(), 4 * MAX_FILES_PER_ROUND):
            if budget <= 0 or len(plan) >= MAX_FILES_PER_ROUND:
                break
            if not inode.size or inode.size > budget:
                continue
            node = max(room, key=room.__getitem__)
            if room[node] < inode.size:
                continue
            path = self.engine.ns.path_of(inode.ino)
            if path is None:
                continue
            plan.append((node, path, inode.size))
            room[node] -= inode.size
            budget -= inode.size
        if not plan:
            return 0
        own = self.link.ownership
        for node, path, _size in plan:
            own.notify(node, "adopt", path)
        await self.engine.ns.journal.sync()
        self.stats.hot_rounds = 0
        self.stats.rounds_acted += 1
        self.stats.handed_over_files += len(plan)
        self.stats.handed_over_bytes += sum(size for _, _, size in plan)
        self.stats.last_round = time.time()
        log.info("rebalance: fast tier at %.0f%% for %d checks; handing %d files (%d bytes) to %s",
                 100 * self.fraction(mine), self.rounds, len(plan), sum(s for _, _, s in plan),
                 sorted({n for n, _, _ in plan}))
        return len(plan)

    async def adopt(self, path: bytes, sender: str) -> None:
        """(inbox) ``sender``'s fast tier is hot: take ``path`` over if we still have room."""
        meta = await self.link.ownership.store_entry(path)
        if meta is None or meta.kind != "file" or meta.primary != sender:
            return  # changed since it was asked
        mine = self.load()
        if mine["fast_used"] + meta.size > mine["low"] * mine["capacity"]:
            self.stats.refused += 1
            log.info("rebalance: not adopting %r from %s: our fast tier has no room below the low watermark",
                     path, sender)
            return
        node = self.link.remote_node(path, meta)
        own = self.link.ownership
        inode = await own.take_over(node, truncate=False)
        await own.write_done(inode.ino, keep=False)  # nothing will write it: release the lease now
        self.stats.adopted_files += 1
        self.stats.adopted_bytes += inode.size
        log.info("rebalance: adopted %r (%d bytes) from %s", path, inode.size, sender)

    def status(self) -> dict:
        d = dict(self.stats.__dict__)
        d.update(interval=self.interval, rounds=self.rounds)
        return d
