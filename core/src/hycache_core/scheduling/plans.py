"""2-Layer Scheduling, layer 2: each node's plan (prefetch, evict, pin, unpin steps) from its
reference string by the cost/gain heuristic; see :func:`plan_node`.

The rules a node's plan keeps:

* Step actions: ``prefetch`` (bring ``path`` into the fast tier from ``source``: a node's
  name — this node's own name means promote the local copy — or ``"slow"``, the shared
  slow tier) and ``evict`` (drop it from the fast tier), both decided by the heuristic
  within the capacity; ``pin`` for each output the job writes that the plan keeps in the
  fast tier (the output is written there: the agent must keep it, not fetch it; it comes
  after the evictions that make its room); ``unpin`` after a job for each resident file
  with no planned reference left on this node (from then on the agent's own policy may
  evict it).  Prefetched and pinned files are held for the plan until their ``evict`` or
  ``unpin``.  While a job is planned, the files it has in the fast tier are not chosen
  as victims for its other files: one input never pushes out another, so every input the
  plan stages is there when the job starts.  A step's ``resident`` is the plan's
  fast-tier bytes after it.
* The node's real contents are the starting state (:func:`node_state` reads them from a
  census): ``resident`` (file → bytes) are the workflow's files already on this fast tier
  — a job reading one needs no prefetch, and the plan may evict them unless they are in
  ``pinned`` — and ``held`` bytes of it are taken by files the plan cannot move (pinned
  or open, not the workflow's).
* The steps run while the node's previous job runs: a job's prefetches are released when
  the job before it has read its inputs (``release="reads"``, the control plane's
  default) or when it starts (``release="start"``).  The files that job has open then are
  never victims of the next job's steps — its outputs, and with ``release="start"`` its
  inputs too (once it has read them they are closed, and an input with no later
  reference here is the cheapest room there is) — and its outputs that the plan does not
  keep still take their room on the fast tier (the agent writes new data there) until
  that job ends.  The evictions that make room for a job's outputs are before-steps too
  (released with its prefetches), so they never take those files either.
* ``first_reads_in_place``: the node's first job reads its inputs from this node's own
  slow tier (source: this node, or ``"slow"``) where they are — no prefetch for them,
  and no eviction to make their room.  (An input another node holds is still prefetched:
  that fetch is the one its open would make anyway, and its copy is dropped, not written
  back, when evicted.)  Its before-steps would be released at the moment it can start
  (no job before it on the node; its parents, if any, have just finished), so a prefetch
  could only move its read, not hide it, and the job would wait for it; the evictions
  that made room would add demotions (a write to the slow tier each).  Its inputs already
  on the fast tier (``resident``) stay there, and the next job's prefetches (released
  when it has read its inputs) overlap it.  The later jobs of the node read those
  in-place inputs in place too: the first job's read left them in the node's page cache,
  so staging them would only copy them from there into the fast tier, at the price of
  evictions (demotions).
* ``read_elsewhere`` (file → reads): of the files already on this fast tier
  (``resident``) that no job of this node references, how often other nodes' jobs read
  them.  Each read counts as two planned references, like a read by a job here (its
  staging and its read), so their eviction costs size × 2 × reads, not 0: evicting one is
  a demotion (a write to the slow tier), and each of those reads would then fetch it
  from the slow tier instead of this fast tier.
* ``before``: the job still running on the node when these steps are released (the plan
  is made at that release, from the node's contents then: :func:`plan_release`).  Its
  files that are on the fast tier are not victims (its outputs, and with
  ``release="start"`` its inputs), and its outputs not there yet take their room until
  ``jobs[0]`` runs, as for a job before within the plan.  ``in_place``: the files read in
  place instead of the ones ``first_reads_in_place`` would choose (a plan made after the
  node's first job has read its inputs).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

from ..policies.heuristic import HeuristicPolicy
from ..workflow import Workflow, WorkflowJob

# -- layer 2: each node's plan ----------------------------------------------------------

UNBOUNDED = 1 << 62  # the room of a fast tier with no capacity given


class _NodeCache:
    """The CacheView the heuristic needs, with pins that follow the plan."""

    def __init__(self, capacity: int, pinned: Iterable[Hashable]) -> None:
        self.capacity = capacity
        self.used = 0
        self.sizes: dict[Hashable, int] = {}
        self.always = frozenset(pinned)
        self.job: set[Hashable] = set()  # the running job's files: it needs them until it ends
        self.busy: set[Hashable] = set()  # the job before it: open while this job's steps run

    def is_pinned(self, key: Hashable) -> bool:
        return key in self.job or key in self.busy or key in self.always


class _NodePlan:
    """One node's plan as it is made: the heuristic, the fast tier it advises (starting
    from the census) and the steps so far."""

    def __init__(self, references: Iterable[str], room: int, pinned: Iterable[str],
                 resident: Mapping[str, int], source: Mapping[str, str], release: str) -> None:
        self.policy = HeuristicPolicy(references)
        self.room = room
        self.cache = _NodeCache(room, pinned)
        for f, size in resident.items():  # the census: already there at the start
            self.policy.add_resident(f, size)
            self.cache.sizes[f] = size
            self.cache.used += size
        self.source = source
        self.release = release
        self.transient = 0  # the previous job's outputs the plan does not keep: on the fast tier while it runs
        self.steps: list[dict[str, Any]] = []

    def emit(self, job: str, action: str, path: str, size: int, src: str | None) -> None:
        self.steps.append({"step": len(self.steps) + 1, "job": job, "action": action, "path": path,
                           "size": size, "source": src, "resident": self.cache.used})

    def after(self, before: WorkflowJob) -> None:
        """``before`` runs while these steps run: its open files are not victims."""
        cache = self.cache
        cache.busy = {f for f in (*before.outputs, *(before.inputs if self.release == "start" else ()))
                      if f in cache.sizes}
        self.transient = sum(size for f, size in before.outputs.items() if f not in cache.sizes)

    def job(self, job: WorkflowJob, refs: Sequence[tuple[str, str]]) -> None:
        """The steps for ``job``'s references ``(file, kind)``, in order, then its unpins."""
        cache = self.cache
        cache.capacity = max(0, self.room - self.transient)
        written = 0
        for f, kind in refs:
            if kind == "write":
                # the job runs: the one before it has ended, and its outputs the plan does
                # not keep are closed (the agent's evictor may take them).  Its files stay
                # out of the victims all the same: an evict is a before-step, released when
                # the job before starts (not ends), so an evict made for this job's outputs
                # runs while that job still reads its files
                cache.capacity = self.room
            written += self._access(job, f, kind)
        # open while the next job's steps run: its outputs (being written); its inputs too
        # when those steps are released at its start (with "reads", it has closed them)
        cache.busy = {f for f in cache.job if f in cache.sizes and (self.release == "start" or f in job.outputs)}
        cache.job.clear()
        self.transient = written
        for f in dict.fromkeys([*job.inputs, *job.outputs]):
            if f in cache.sizes and self.policy.remaining(f) == 0:
                self.emit(job.id, "unpin", f, cache.sizes[f], None)

    def _access(self, job: WorkflowJob, f: str, kind: str) -> int:
        """One reference's steps; the bytes of an output written but not kept."""
        cache = self.cache
        size = job.inputs[f] if kind != "write" else job.outputs[f]
        d = self.policy.access(f, size, cache)
        if d.hit:
            if cache.sizes.get(f, size) != size:  # a census copy of another size: the job's counts
                cache.used += size - cache.sizes[f]
                cache.sizes[f] = size
            cache.job.add(f)
            return 0
        for v in d.victims:
            vs = cache.sizes.pop(v)
            cache.used -= vs
            self.emit(job.id, "evict", str(v), vs, None)
        if not d.admit:
            return size if kind == "write" else 0
        cache.sizes[f] = size
        cache.used += size
        cache.job.add(f)
        if kind == "write":
            self.emit(job.id, "pin", f, size, None)
        else:
            self.emit(job.id, "prefetch", f, size, self.source.get(f, "slow"))
        return 0


def _references(jobs: Sequence[WorkflowJob], in_place: set[str]) -> list[list[tuple[str, str]]]:
    """Each job's references ``(file, kind)``: a staging (``pre``) and a ``read`` for each
    input not read in place, a ``write`` for each output."""
    refs = []
    for job in jobs:
        ins = [f for f in job.inputs if f not in in_place]
        refs.append([*((f, "pre") for f in ins), *((f, "read") for f in ins), *((f, "write") for f in job.outputs)])
    return refs


def plan_node(node: str, jobs: Sequence[WorkflowJob], capacity: int | None,
              source: Mapping[str, str], pinned: Iterable[str] = (), *,
              resident: Mapping[str, int] | None = None, held: int = 0,
              first_reads_in_place: bool = False,
              read_elsewhere: Mapping[str, int] | None = None,
              release: str = "reads", before: WorkflowJob | None = None,
              in_place: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """One node's ordered steps for its ``jobs`` (in execution order), the rules in this
    module's docstring.  ``capacity``: the node's fast tier (``None``: unbounded);
    ``source``: where each file it reads comes from (:func:`prefetch_sources`).

    Keyword groups: the node's contents at the start — ``pinned``, ``resident``, ``held``
    (:func:`node_state`) and ``read_elsewhere``; when the steps run — ``release`` and
    ``before``; the inputs read in place — ``first_reads_in_place`` or ``in_place``."""
    resident = resident or {}
    if in_place is not None:
        in_place = set(in_place)
    else:
        # the first job's inputs read in place from this node's slow tier: that read leaves
        # them in this node's page cache, so the later jobs here read them in place too
        # (staging one would copy it from that cache into the fast tier and evict files for
        # it — each eviction a write to the slow tier — for a read the cache already serves)
        in_place = ({f for f in jobs[0].inputs if f not in resident and source.get(f, "slow") in (node, "slow")}
                    if first_reads_in_place and jobs else set())
    refs = _references(jobs, in_place)
    local = {f for job_refs in refs for f, _ in job_refs}
    elsewhere = [f for f, n in (read_elsewhere or {}).items() if f in resident and f not in local
                 for _ in range(2 * max(0, n))]  # each read weighs as a job's here: staging + read
    room = max(0, (capacity if capacity is not None else UNBOUNDED) - max(0, held))
    plan = _NodePlan([*(f for job_refs in refs for f, _ in job_refs), *elsewhere], room, pinned,
                     resident, source, release)
    if before is not None:
        plan.after(before)
    for job, job_refs in zip(jobs, refs):
        if job_refs:  # a job with no references here has no steps, and leaves the state as it is
            plan.job(job, job_refs)
    return plan.steps

BEFORE_STEPS = ("prefetch", "evict")


def plan_release(node: str, jobs: Sequence[WorkflowJob], capacity: int | None,
                 source: Mapping[str, str], pinned: Iterable[str] = (), *,
                 resident: Mapping[str, int] | None = None, held: int = 0,
                 before: WorkflowJob | None = None, in_place: Iterable[str] = (),
                 read_elsewhere: Mapping[str, int] | None = None,
                 release: str = "reads") -> list[dict[str, Any]]:
    """Layer 2 at a release: the before-steps (``prefetch``, ``evict``) of ``jobs[0]``,
    planned from the node's contents at the moment its turn comes (``resident``,
    ``held``, ``pinned``: :func:`node_state` of a census taken then, plus the copies and
    steps the node holds), with ``before`` — the job before it on the node, still
    running — and the node's later jobs (``jobs[1:]``, their references are what the
    heuristic weighs).  The same :func:`plan_node`, so the same steps a plan made at
    submission would have given ``jobs[0]`` from that state; numbered from 1."""
    if not jobs:
        return []
    steps = plan_node(node, jobs, capacity, source, pinned, resident=resident, held=held,
                      read_elsewhere=read_elsewhere, release=release, before=before, in_place=in_place)
    first = [st for st in steps if st["job"] == jobs[0].id and st["action"] in BEFORE_STEPS]
    for k, st in enumerate(first, 1):
        st["step"] = k
    return first


def node_state(files: Mapping[str, Mapping[str, Any]], nodes: Sequence[str],
               status: Mapping[str, Mapping[str, Any] | None] | None = None
               ) -> tuple[dict[str, dict[str, int]], dict[str, int], dict[str, set[str]]]:
    """Each node's fast tier as layer 2 starts from it, from a census.

    ``files``: the workflow's files that exist, each ``{"node": primary, "tier":
    "fast"|"slow", "size": bytes, "pinned": bool}`` (the DHT's entries); ``status``: each
    node's fast-tier census (the heartbeat's ``tiers.fast``: ``used``, ``pinned_bytes``,
    and the moves under way: ``moving_in_bytes``, ``moving_out_bytes`` and ``moving``,
    ``[{"path", "to", "bytes"}]``).
    Returns ``(resident, held, pinned)``: per node, the workflow's files on its fast tier
    (file → bytes), the bytes the plan cannot move (pinned files that are not the
    workflow's, and the room that moves under way take), and the workflow's files pinned
    there.

    Moves under way (the DHT shows a file's tier only once its move has switched): a
    workflow file moving onto the node's fast tier (a promotion, or a remote copy a
    prefetch is fetching) counts as resident — its room is taken and a job finds it
    there; any other move onto it, and every move off it, is held: a file being demoted
    keeps its room until its switch, and a workflow file leaving is not resident (a job
    reading it needs a prefetch).  Held for the whole plan made from this census: a few
    seconds' moves cost it that much room, rather than a prefetch failing for room (the
    control plane plans each job again at its release, :func:`plan_release`, from the
    census of that moment)."""
    resident: dict[str, dict[str, int]] = {n: {} for n in nodes}
    pinned: dict[str, set[str]] = {n: set() for n in nodes}
    pinned_here: dict[str, int] = {n: 0 for n in nodes}
    for f, e in files.items():
        n = e.get("node")
        if n in resident and e.get("tier") == "fast":
            size = int(e.get("size") or 0)
            resident[n][f] = size
            if e.get("pinned"):
                pinned[n].add(f)
                pinned_here[n] += size
    by_path = {f if f.startswith("/") else "/" + f: f for f in files}
    held: dict[str, int] = {}
    for n in nodes:
        fast = (status or {}).get(n) or {}
        pb = fast.get("pinned_bytes")
        held[n] = max(0, int(pb) - pinned_here[n]) if isinstance(pb, (int, float)) else 0
        listed = {"fast": 0, "out": 0}
        for mv in fast.get("moving") or ():
            moving, size = by_path.get(mv.get("path")), int(mv.get("bytes") or 0)  # moving: the workflow's file
            entering = mv.get("to") == "fast"
            listed["fast" if entering else "out"] += size
            if entering and moving is not None:
                resident[n].setdefault(moving, int(files[moving].get("size") or size))
                continue
            if moving is not None and resident[n].pop(moving, None) is not None:
                pinned[n].discard(moving)
            held[n] += size
        for key, kind in (("moving_in_bytes", "fast"), ("moving_out_bytes", "out")):  # beyond the list
            total = fast.get(key)
            if isinstance(total, (int, float)):
                held[n] += max(0, int(total) - listed[kind])
    return resident, held, pinned


def prefetch_sources(wf: Workflow, placement: Mapping[str, str],
                     locations: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """For each node, where each file it reads comes from: the node itself when it
    holds the file (written there or located there), else the first writer's node, else
    the located node, else ``"slow"``."""
    locations = locations or {}
    writer_nodes: dict[str, list[str]] = defaultdict(list)
    for job in wf.jobs:
        for f in job.outputs:
            writer_nodes[f].append(placement[job.id])
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for job in wf.jobs:
        node = placement[job.id]
        for f in job.inputs:
            holders = writer_nodes.get(f, [])
            if node in holders or locations.get(f) == node:
                out[node][f] = node
            elif holders:
                out[node][f] = holders[0]
            elif f in locations:
                out[node][f] = locations[f]
            else:
                out[node][f] = "slow"
    return out


def plan_nodes(wf: Workflow, placement: Mapping[str, str], nodes: Sequence[str],
               capacity: int | Mapping[str, int | None] | None = None,
               locations: Mapping[str, str] | None = None, *,
               state: tuple[Mapping[str, Mapping[str, int]], Mapping[str, int], Mapping[str, Iterable[str]]]
               | None = None, first_reads_in_place: bool = False,
               release: str = "reads") -> dict[str, list[dict[str, Any]]]:
    """Layer 2 for every node of ``nodes``: :func:`plan_node` over its jobs in order,
    from each node's real contents when ``state`` (:func:`node_state`) is given; each
    node's first job reads its inputs in place with ``first_reads_in_place`` (see
    :func:`plan_node`; ``place`` asks for it on the live cluster, with a census)."""
    by_node: dict[str, list[WorkflowJob]] = {n: [] for n in nodes}
    for job in wf.jobs:
        by_node.setdefault(placement[job.id], []).append(job)
    sources = prefetch_sources(wf, placement, locations)
    resident, held, pins = state if state is not None else ({}, {}, {})
    reads: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # node → file → its jobs' reads
    for job in wf.jobs:
        for f in job.inputs:
            reads[placement[job.id]][f] += 1
    plans = {}
    for n, jobs in by_node.items():
        cap = capacity.get(n) if isinstance(capacity, Mapping) else capacity
        here = resident.get(n) or {}
        elsewhere = {f: sum(r.get(f, 0) for m, r in reads.items() if m != n) for f in here}
        plans[n] = plan_node(n, jobs, cap, sources.get(n, {}), {*wf.pinned, *pins.get(n, ())},
                             resident=here, held=held.get(n, 0),
                             first_reads_in_place=first_reads_in_place,
                             read_elsewhere={f: k for f, k in elsewhere.items() if k}, release=release)
    return plans
