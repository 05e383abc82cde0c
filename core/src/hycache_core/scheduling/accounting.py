"""2-Layer Scheduling: the accounting — bytes moved between nodes and from the slow tier
(:func:`transfer_bytes`, the issue-9 definition), and a placement's makespan (list
scheduling per node, :func:`makespan`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from ..workflow import Workflow
from .problem import SLOW, Problem

# -- the accounting -----------------------------------------------------------------

def transfer_bytes(wf: Workflow, placement: Mapping[str, str],
                   locations: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(bytes moved between nodes, bytes read from the shared slow tier)`` for a
    placement (job id → node name), by the issue's definition."""
    locations = locations or {}
    readers: dict[str, set[str]] = defaultdict(set)
    holders: dict[str, set[str]] = defaultdict(set)
    for job in wf.jobs:
        node = placement[job.id]
        for f in job.inputs:
            readers[f].add(node)
        for f in job.outputs:
            holders[f].add(node)
    moved = slow = 0
    for f, nodes in readers.items():
        held = holders.get(f, set())
        loc = locations.get(f)
        if held or loc is not None:
            if loc is not None:
                held = held | {loc}
            moved += wf.sizes[f] * len(nodes - held)
        else:
            slow += wf.sizes[f] * len(nodes)
    return moved, slow


def _cost(p: Problem, assign: Sequence[int]) -> int:
    moved = 0
    for f in range(len(p.files)):
        if not p.readers[f] or not (p.writers[f] or p.init[f] != SLOW):
            continue
        held = {assign[w] for w in p.writers[f]}
        held.add(p.init[f])
        moved += p.size[f] * len({assign[j] for j in p.readers[f]} - held)
    return moved


def _loads(p: Problem, assign: Sequence[int]) -> list[float]:
    load = [0.0] * len(p.nodes)
    for j, n in enumerate(assign):
        load[n] += p.weight[j]
    return load


# -- the makespan -------------------------------------------------------------------

DEFAULT_MAKESPAN_SLACK = 0.2
LARGE_INSTANCE = 1_000  # jobs: above, the local search starts only from Mt-KaHyPar's partition and the seeds


def _upward_rank(p: Problem) -> list[float]:
    """Each job's runtime plus the longest chain of runtimes below it."""
    children: list[list[int]] = [[] for _ in p.jobs]
    for j, ps in enumerate(p.parents or []):
        for q in ps:
            children[q].append(j)
    rank = [0.0] * len(p.jobs)
    for j in range(len(p.jobs) - 1, -1, -1):  # jobs are in topological order
        rank[j] = p.weight[j] + max((rank[c] for c in children[j]), default=0.0)
    return rank


def makespan(p: Problem, assign: Sequence[int], *, slots: int = 1, rank: Sequence[float] | None = None) -> float:
    """The placement's makespan by list scheduling on each node: a node runs ``slots``
    jobs at a time; a job is ready when its parents (the DAG) have finished; a free slot
    takes its node's ready job with the longest chain below it (upward rank, then the
    topological order).  Job durations are the weights (runtimes, or 1 per job when
    runtimes are unknown); transfers take no time here."""
    import heapq

    J = len(p.jobs)
    if not J:
        return 0.0
    rank = rank if rank is not None else _upward_rank(p)
    parents = p.parents or [[] for _ in range(J)]
    children: list[list[int]] = [[] for _ in range(J)]
    waiting = [len(ps) for ps in parents]
    for j, ps in enumerate(parents):
        for q in ps:
            children[q].append(j)
    ready: list[list[tuple[float, int]]] = [[] for _ in p.nodes]
    free = [slots] * len(p.nodes)
    events: list[tuple[float, int]] = []  # (finish time, job)
    for j in range(J):
        if not waiting[j]:
            heapq.heappush(ready[assign[j]], (-rank[j], j))
    now = 0.0
    done = 0

    def start(n: int) -> None:
        while free[n] and ready[n]:
            _, j = heapq.heappop(ready[n])
            free[n] -= 1
            heapq.heappush(events, (now + p.weight[j], j))

    for n in range(len(p.nodes)):
        start(n)
    while events:
        now, j = heapq.heappop(events)
        done += 1
        n = assign[j]
        free[n] += 1
        touched = {n}
        for c in children[j]:
            waiting[c] -= 1
            if not waiting[c]:
                heapq.heappush(ready[assign[c]], (-rank[c], c))
                touched.add(assign[c])
        for m in touched:
            start(m)
    return now


def makespan_lower_bound(p: Problem, *, slots: int = 1) -> float:
    """No placement finishes sooner: the longest chain, and the total over all slots."""
    if not p.jobs:
        return 0.0
    return max(max(_upward_rank(p)), sum(p.weight) / (len(p.nodes) * slots))
