"""``tiering`` on GET /nodes/{id} and GET /summary: what the tiering bought, from the
agents' cumulative counters, and how each node counted it (passthrough on or off)."""

from __future__ import annotations

from .conftest import Api

MiB = 1 << 20


def _counters(fast_read: int, kernel_read: int, grown: int, *, passthrough: bool, traced: bool = True,
              hits: int = 0, misses: int = 0) -> dict:
    reads = ("traced" if traced else "none") if passthrough else "agent"
    return {"fast": {"read_bytes": fast_read, "write_bytes": grown + 100, "hits": hits,
                     "kernel_read_bytes": kernel_read, "grown_bytes": grown},
            "slow": {"read_bytes": 7 * MiB, "write_bytes": 0, "hits": misses},
            "remote": {"read_bytes": 5},
            "misses": misses, "migrations": 2, "migration_bytes": 3 * MiB,
            "promoted_bytes": MiB, "evicted_bytes": 2 * MiB,
            "counting": {"passthrough": passthrough, "reads": reads, "writes": "growth" if passthrough else "agent",
                         "kernel_reads": {"active": traced, "reason": "x", "other_bytes": 0, "lost_events": 3}}}


def test_tiering_per_node_and_summed_over_the_cluster(api: Api):
    api.beat("pt", counters=_counters(600 * MiB, 600 * MiB, 200 * MiB, passthrough=True, hits=3, misses=1))
    api.beat("agent", counters=_counters(10 * MiB, 0, 0, passthrough=False, hits=1, misses=3))
    api.beat("old", counters={"fast": {"read_bytes": 1, "hits": 0}})  # an agent that does not say

    pt = api.get("/api/v1/nodes/pt").json()["tiering"]
    assert pt == {"hits": 3, "misses": 1, "hit_ratio": 0.75,
                  "fast_read_bytes": 600 * MiB, "slow_read_bytes": 7 * MiB, "remote_read_bytes": 5,
                  "fast_write_bytes": 200 * MiB + 100, "slow_write_bytes": 0,
                  "fast_kernel_read_bytes": 600 * MiB, "slow_kernel_read_bytes": 0,
                  "fast_grown_bytes": 200 * MiB, "slow_grown_bytes": 0,
                  "promoted_bytes": MiB, "evicted_bytes": 2 * MiB, "kernel_read_events_lost": 3,
                  "counting": {"traced": 1}}
    assert api.get("/api/v1/nodes/agent").json()["tiering"]["counting"] == {"agent": 1}
    old = api.get("/api/v1/nodes/old").json()["tiering"]
    assert old["counting"] == {"unknown": 1} and old["hit_ratio"] is None and old["fast_read_bytes"] == 1
    # the node's raw counters are still there, as the agent sent them
    assert api.get("/api/v1/nodes/pt").json()["counters"]["fast"]["kernel_read_bytes"] == 600 * MiB

    s = api.get("/api/v1/summary").json()["tiering"]
    assert s["fast_read_bytes"] == 610 * MiB + 1 and s["slow_read_bytes"] == 14 * MiB
    assert s["fast_kernel_read_bytes"] == 600 * MiB and s["fast_grown_bytes"] == 200 * MiB
    assert s["promoted_bytes"] == 2 * MiB and s["evicted_bytes"] == 4 * MiB
    assert s["hits"] == 4 and s["misses"] == 4 and s["hit_ratio"] == 0.5
    assert s["counting"] == {"agent": 1, "traced": 1, "unknown": 1}
    assert s["kernel_read_events_lost"] == 6

    # a node's newer counters replace its old ones in the sums (never added twice)
    api.beat("pt", seq=2, counters=_counters(700 * MiB, 700 * MiB, 200 * MiB, passthrough=True, traced=False,
                                              hits=3, misses=1))
    s = api.get("/api/v1/summary").json()["tiering"]
    assert s["fast_read_bytes"] == 710 * MiB + 1 and s["fast_kernel_read_bytes"] == 700 * MiB
    assert s["counting"] == {"agent": 1, "untraced": 1, "unknown": 1}
