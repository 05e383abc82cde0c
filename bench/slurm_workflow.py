"""A WfCommons workflow run through real Slurm three ways (issue 35, docs/slurm.md): Slurm
alone (plain ``sbatch``), Slurm with HyCache's node choice (job_submit.lua), and Slurm with
node choice and burst-buffer staging (burst_buffer.lua), each submitted by
``hycache-control slurm submit-workflow --mode slurm|place|stage``; a fourth run in stage
mode kills the control plane (SIGKILL) once a third of its jobs are done.

The stack: munged, slurmctld and three slurmd (n1–n3, one host, tests/slurm/slurmcluster.py),
a Redis Cluster, the control plane and three agents named n1–n3 whose slow tiers share one
file system on a loop device throttled to ``--mbps`` (bench/slowtier.py, the HDD model).
Each way runs under its own namespace directory; its inputs (the files no task writes)
are written in contiguous runs through n2, n3, n1 (as if each node had ingested
neighbouring images; not the order Slurm fills idle nodes in), demoted to the slow tiers
and dropped from the page cache before the jobs are submitted.

Per way: makespan (first sbatch to the last job seen COMPLETED), bytes moved between
nodes (the agents' ``remote.fetch_bytes``), first-read hit ratio on the fast tier (the
agents' fast hits / (hits + misses) of the jobs' opens for reading: each job reads each
input once), seconds jobs waited for staging (stage-in to the last prefetch done, summed)
and the share of jobs that ran on the node HyCache chose (the control plane's Slurm jobs:
``staged_on``, the node asked for at stage-in, vs ``ran_on``).  Every output is read back
and compared with what its job wrote.

    python bench/slurm_workflow.py [--images 4] [--mib 2] [--mbps 20] [--json FILE]   # root
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from hycache_core.workflow import load_workflow
from hycache_harness import executable, wait_for

REPO = Path(__file__).resolve().parents[1]
MODES = ("slurm", "place", "stage")


def montage(images: int = 4, mib: float = 2.0) -> dict[str, Any]:
    """A WfFormat 1.5 instance of Montage's shape: mProject per image, mDiffFit per
    neighbour pair, mConcatFit, mBgModel, mBackground per image, mImgtbl, mAdd, mViewer
    (4 images: 16 tasks).  Raw and projected images are ``mib`` MiB each."""
    S = int(mib * (1 << 20))
    files: dict[str, int] = {}
    tasks: list[dict[str, Any]] = []
    runtimes: dict[str, float] = {}

    def task(tid: str, ins: list[str], outs: dict[str, int], parents: list[str], runtime: float) -> None:
        files.update(outs)
        tasks.append({"name": tid, "id": tid, "parents": parents, "children": [], "inputFiles": ins,
                      "outputFiles": list(outs)})
        runtimes[tid] = runtime
    for i in range(images):
        files[f"raw_{i}.fits"] = S
        task(f"mProject_{i}", [f"raw_{i}.fits"], {f"proj_{i}.fits": S}, [], 4.0)
    for i in range(images - 1):
        task(f"mDiffFit_{i}", [f"proj_{i}.fits", f"proj_{i + 1}.fits"], {f"diff_{i}.fits": S // 8},
             [f"mProject_{i}", f"mProject_{i + 1}"], 2.0)
    task("mConcatFit", [f"diff_{i}.fits" for i in range(images - 1)], {"fits.tbl": 4096},
         [f"mDiffFit_{i}" for i in range(images - 1)], 1.0)
    task("mBgModel", ["fits.tbl"], {"corrections.tbl": 4096}, ["mConcatFit"], 1.0)
    for i in range(images):
        task(f"mBackground_{i}", [f"proj_{i}.fits", "corrections.tbl"], {f"bg_{i}.fits": S},
             [f"mProject_{i}", "mBgModel"], 2.0)
    task("mImgtbl", [f"bg_{i}.fits" for i in range(images)], {"images.tbl": 4096},
         [f"mBackground_{i}" for i in range(images)], 1.0)
    task("mAdd", [f"bg_{i}.fits" for i in range(images)] + ["images.tbl"], {"mosaic.fits": S},
         [f"mBackground_{i}" for i in range(images)] + ["mImgtbl"], 3.0)
    task("mViewer", ["mosaic.fits"], {"mosaic.jpg": S // 4}, ["mAdd"], 1.0)
    return {"name": f"montage-{images}", "schemaVersion": "1.5", "workflow": {
        "specification": {"tasks": tasks, "files": [{"id": f, "sizeInBytes": n} for f, n in files.items()]},
        "execution": {"makespanInSeconds": 0, "executedAt": "2026-11-29T00:00:00Z",
                      "tasks": [{"id": t, "runtimeInSeconds": r, "command": {"program": t.split("_")[0]}}
                                for t, r in runtimes.items()]}}}


def expected(path: str, size: int) -> bytes:
    """What a job of ``submit-workflow`` writes to ``path``: the path and a newline, repeated, cut at ``size``."""
    line = (path + "\n").encode()
    return (line * (size // len(line) + 1))[:size]


class WorkflowBench:
    """One workflow instance run through ``slurm`` (a SlurmCluster), the control plane
    (``api``: an admin httpx client) and the agents' ``mounts`` ({node: mount point})."""

    def __init__(self, slurm: Any, api: httpx.Client, mounts: dict[str, Path], instance: Path, *,
                 token_file: Path | None = None, slow: Any = None, compute_scale: float = 0.0,
                 slack: float = 0.1, log: Callable[[str], None] = print) -> None:
        self.slack = slack  # the manifest's load bound slack (submit-workflow --slack)
        self.slurm, self.api, self.mounts, self.instance = slurm, api, mounts, instance
        self.token_file = token_file  # an admin token: the workflow is placed as a manifest
        self.slow, self.compute_scale, self.log = slow, compute_scale, log
        self.wf = load_workflow(instance)
        self.nodes = list(mounts)

    # -- before the jobs -----------------------------------------------------------------------

    def prepare(self, prefix: str) -> dict[str, str]:
        """The way's inputs (files no task writes) written in contiguous runs from the second
        node on (n2 holds the first images, n3 the next, ...: neither Slurm's first-idle
        order nor one file a node), published, demoted to the slow tier; the device's page
        cache dropped.  Input path -> node."""
        d = self.mounts[self.nodes[0]] / prefix.strip("/")
        d.mkdir()
        d.chmod(0o1777)  # the jobs run as nobody
        for m in self.mounts.values():  # the other nodes see it once it is published
            wait_for(lambda m=m: (m / prefix.strip("/")).is_dir(), 30, f"{prefix} seen through {m}")
        written = {f for j in self.wf.jobs for f in j.outputs}
        raw = list(dict.fromkeys(f for j in self.wf.jobs for f in j.inputs if f not in written))
        # in contiguous runs (a node holds neighbouring images), from the second node on
        order = self.nodes[1:] + self.nodes[:1]
        per = -(-len(raw) // len(order))
        where: dict[str, str] = {}
        for k, f in enumerate(raw):
            node = order[k // per]
            path = f"{prefix}/{f}"
            (self.mounts[node] / path.lstrip("/")).write_bytes(os.urandom(self.wf.sizes[f]))
            where[path] = node
        for path, node in where.items():
            size = self.wf.sizes[path.rsplit("/", 1)[1]]
            last: list[Any] = []

            def published(p: str = path, n: int = size) -> bool:
                r = self.api.get("/api/v1/files/info", params={"path": p})
                last[:] = [r.status_code, r.text[:300]]
                return r.status_code == 200 and r.json()["size"] == n and r.json()["primary"] == node
            try:
                wait_for(published, 60, f"{path} published by {node} ({size} bytes)")
            except AssertionError as e:
                raise AssertionError(f"{e}: {last}") from None
        r = self.api.post("/api/v1/files/actions", json={"action": "demote", "paths": list(where)})
        assert r.status_code == 202, r.text
        act = wait_for(lambda: (a := self.api.get(f"/api/v1/actions/{r.json()['id']}").json())["state"]
                       in ("done", "failed") and a, 120, "the inputs' demotion")
        assert act["state"] == "done", act["items"]
        if self.slow is not None:
            self._settle()
        return where

    def _settle(self, quiet: float = 1.0, timeout: float = 60.0) -> None:
        """Until the slow device has written nothing for ``quiet`` s; then its cache is dropped."""
        deadline, w = time.monotonic() + timeout, self.slow.write_bytes()
        while time.monotonic() < deadline:
            time.sleep(quiet)
            w, w0 = self.slow.write_bytes(), w
            if w == w0:
                break
        self.slow.drop_cache()

    def counters(self, after: float) -> dict[str, dict[str, Any]]:
        """Each node's counters from a heartbeat later than ``after`` (time.time())."""
        out = {}
        for n in self.nodes:
            v = wait_for(lambda n=n: (x := self.api.get(f"/api/v1/nodes/{n}").json())
                         .get("last_heartbeat", 0) > after and x, 30, f"a heartbeat of {n}")
            out[n] = v.get("counters") or {}
        return out

    # -- the run -------------------------------------------------------------------------------

    def submit(self, mode: str, prefix: str) -> dict[str, int]:
        argv = [executable("hycache-control"), "slurm", "submit-workflow", str(self.instance), "--mode", mode,
                "--prefix", prefix, "--log-dir", str(self.slurm.out), "--compute-scale", str(self.compute_scale),
                "--sbatch", "runuser -u nobody -- sbatch --chdir=/tmp", "--json"]
        if self.token_file is not None:
            argv += ["--api", str(self.api.base_url), "--token-file", str(self.token_file),
                     "--slack", str(self.slack)]
        for n, m in self.mounts.items():
            argv += ["--mount", f"{n}={m}"]
        r = subprocess.run(argv, capture_output=True, text=True, env=self.slurm.env, timeout=300)
        assert r.returncode == 0, f"submit-workflow: {r.stderr}"
        return json.loads(r.stdout)["jobs"]

    def wait_all(self, ids: dict[str, int], timeout: float, on_done: Callable[[int], None] | None = None
                 ) -> tuple[dict[str, dict[str, str]], float]:
        """Until every job is COMPLETED (or one failed): {task: scontrol's fields}, and the
        seconds from now until the last was seen done.  ``on_done(n)`` after each poll."""
        t0, deadline, by_id = time.monotonic(), time.monotonic() + timeout, {v: k for k, v in ids.items()}
        while True:
            out = self.slurm.run("scontrol", "show", "job", "-o").stdout
            jobs = {}
            for line in out.splitlines():
                f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
                if int(f.get("JobId", 0)) in by_id:
                    jobs[by_id[int(f["JobId"])]] = f
            states = [j.get("JobState") for j in jobs.values()]
            done = sum(s == "COMPLETED" for s in states)
            bad = [t for t, j in jobs.items() if j.get("JobState") in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")]
            if done == len(ids) or bad:
                outs = {t: [o.read_text()[-500:] for o in self.slurm.out.glob(f"{t}-{ids[t]}.out")] for t in bad}
                assert not bad, f"jobs {bad} did not complete: {[jobs[t]['JobState'] for t in bad]}: {outs}"
                return jobs, time.monotonic() - t0
            assert time.monotonic() < deadline, f"{done}/{len(ids)} jobs done after {timeout:.0f} s\n" \
                                                f"{self.slurm.log_tail()}"
            if on_done is not None:
                on_done(done)
            time.sleep(0.2)

    def run(self, mode: str, prefix: str, *, kill: Callable[[], None] | None = None,
            timeout: float = 300.0) -> dict[str, Any]:
        """One way: prepare, submit, wait, measure.  ``kill``: called once a third of the
        jobs are done (the control plane killed); no counters are read after it."""
        self.prepare(prefix)
        before = self.counters(time.time()) if kill is None else None
        t0 = time.monotonic()
        ids = self.submit(mode, prefix)
        killed: list[float] = []

        def on_done(n: int) -> None:
            if kill is not None and not killed and n >= len(ids) // 3:
                kill()
                killed.append(time.monotonic() - t0)
        jobs, _ = self.wait_all(ids, timeout, on_done)
        makespan = time.monotonic() - t0
        res: dict[str, Any] = {"mode": mode, "jobs": len(ids), "makespan": round(makespan, 2),
                               "killed_at": round(killed[0], 2) if killed else None,
                               "ran_on": {t: j["NodeList"] for t, j in jobs.items()},
                               "start_delays": self.start_delays(jobs)}
        if before is not None:
            res.update(self.moved_and_hits(before, self.counters(time.time())))
            res.update(self.placement_and_staging(mode, ids, jobs))
        res["outputs_wrong"] = self.check_outputs(prefix)
        self.log(f"{prefix}: {json.dumps(res)}")
        return res

    # -- the measures ----------------------------------------------------------------------------

    @staticmethod
    def start_delays(jobs: dict[str, dict[str, str]]) -> dict[str, int]:
        """Seconds from each job's eligibility (its parents done) to its start (Slurm's 1 s clock)."""
        from datetime import datetime

        def ts(s: str) -> float:
            return datetime.fromisoformat(s).timestamp()
        return {t: int(ts(j["StartTime"]) - ts(j["EligibleTime"])) for t, j in jobs.items()}

    @staticmethod
    def moved_and_hits(before: dict[str, dict], after: dict[str, dict]) -> dict[str, Any]:
        def delta(n: str, *keys: str) -> int:
            a: Any = after[n]
            b: Any = before[n]
            for k in keys:
                a, b = (a or {}).get(k, 0), (b or {}).get(k, 0)
            return int(a or 0) - int(b or 0)
        hits = sum(delta(n, "fast", "hits") for n in after)
        misses = sum(delta(n, "misses") for n in after)
        return {"moved_bytes": sum(delta(n, "remote", "fetch_bytes") for n in after), "hits": hits,
                "misses": misses, "hit_ratio": round(hits / (hits + misses), 3) if hits + misses else None}

    def placement_and_staging(self, mode: str, ids: dict[str, int], jobs: dict[str, dict[str, str]]
                              ) -> dict[str, Any]:
        """On HyCache's node: ``staged_on`` (the node at stage-in, job_submit.lua's choice)
        == ``ran_on`` == Slurm's NodeList; staging wait: stage-in to the last prefetch done."""
        if mode == "slurm":
            return {"on_chosen": None, "staging_wait": 0.0, "chosen": {}}
        on, wait, chosen, details = 0, 0.0, {}, {}
        for task, jid in ids.items():
            v = wait_for(lambda j=jid: (x := self.api.get(f"/api/v1/slurm/jobs/{j}").json()).get("state") == "done"
                         and x, 60, f"Slurm job {jid} torn down")
            chosen[task] = v["staged_on"]
            details[task] = [f"{i['path']}: {i['state']} {i['detail']}" for i in v["step_items"]]
            on += v["staged_on"] == v["ran_on"] == jobs[task]["NodeList"]
            hooks = {h["hook"]: h["at"] for h in v["hooks"]}
            done = [i.get("updated_at") for i in v["step_items"] if i["state"] == "done"]
            if v["staging"] == "staged" and "stage-in" in hooks and "pre-run" in hooks:
                wait += max(0.0, min(hooks["pre-run"], max([hooks["stage-in"], *[d for d in done if d]]))
                            - hooks["stage-in"])
        return {"on_chosen": round(on / len(ids), 3), "staging_wait": round(wait, 2), "chosen": chosen,
                "steps": details}

    def check_outputs(self, prefix: str) -> list[str]:
        """The outputs whose content (read through the first node's mount) is not what their job wrote."""
        wrong = []
        for job in self.wf.jobs:
            for f, size in job.outputs.items():
                path = f"{prefix}/{f}"
                p = self.mounts[self.nodes[0]] / path.lstrip("/")
                try:
                    ok = p.read_bytes() == expected(path, size)
                except OSError:
                    ok = False
                if not ok:
                    wrong.append(path)
        return wrong


# -- the standalone bench: its own stack ----------------------------------------------------------

def _slurmcluster():
    spec = importlib.util.spec_from_file_location("slurmcluster", REPO / "tests" / "slurm" / "slurmcluster.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'way':<16}{'makespan s':>11}{'moved MiB':>11}{'hit ratio':>10}{'staging wait s':>15}"
          f"{'on chosen':>10}{'max start delay s':>18}{'outputs wrong':>14}")
    for r in results:
        moved = f"{r['moved_bytes'] / 2**20:.1f}" if "moved_bytes" in r else "-"
        hr = r.get("hit_ratio")
        oc = r.get("on_chosen")
        print(f"{r['label']:<16}{r['makespan']:>11.1f}{moved:>11}{hr if hr is not None else '-':>10}"
              f"{r.get('staging_wait', '-'):>15}{oc if oc is not None else '-':>10}"
              f"{max(r['start_delays'].values()):>18}{len(r['outputs_wrong']):>14}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=4, help="Montage images (4: 16 tasks)")
    ap.add_argument("--mib", type=float, default=2.0, help="MiB per image (default 2)")
    ap.add_argument("--mbps", type=float, default=20.0, help="the slow tiers' device, MB/s (default 20)")
    ap.add_argument("--compute-scale", type=float, default=0.0, help="jobs sleep this × their runtime")
    ap.add_argument("--slack", type=float, default=1.0, help="the manifest's load bound slack (default 1)")
    ap.add_argument("--json", type=Path, metavar="FILE", help="write the results here too")
    args = ap.parse_args()
    from slurm_stack import stack  # bench/: the stack the test runs on too
    tmp = Path(tempfile.mkdtemp(prefix="slurm-workflow-"))
    inst = tmp / "montage.json"
    inst.write_text(json.dumps(montage(args.images, args.mib)))
    try:
        with stack(tmp, _slurmcluster().SlurmCluster, mbps=args.mbps) as st:
            inst.chmod(0o644)
            b = WorkflowBench(st.slurm, st.api, st.mounts, inst, token_file=st.token_file, slow=st.slow,
                              compute_scale=args.compute_scale, slack=args.slack)
            results = [{"label": m, **b.run(m, f"/{m}")} for m in MODES]
            results.append({"label": "stage, cp killed", **b.run("stage", "/killed", kill=st.kill_control_plane)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
