"""What the chaos tests share (test_compose_chaos: the compose cluster; test_ansible_rollout:
the systemd hosts): the load while a part is down, the hash check, the workflow and the
report line.

* `Writers`: one thread per writing container writes small files of random bytes into a
  directory of its mount (`cat > FILE && sync FILE` through `docker exec`); a write
  answered 0 is acknowledged and its sha256 kept, a write that fails or hangs during the
  outage is attempted, not lost.
* `Probes`: GET /api/v1/nodes four times a second: (time, ok), and one node's (time,
  state, boot_id) as the answers show it.
* `check_files`: every acknowledged file read back by hash on every agent.
* the workflow: a manifest POSTed before the first kill, one of its jobs started before
  each kill and finished after it; `check_workflow` at the end: nothing lost, nothing run
  twice to a different result.

`api` below is a callable `api(path, method="GET", timeout=10, **httpx_kw) -> Response`
with the admin token (the tests' `Stack.api` and `Cluster.api`).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from hycache_harness import wait_for as _wait_for

Api = Callable[..., httpx.Response]
TINY = Path(__file__).resolve().parents[2] / "tests" / "core" / "data" / "wfformat-1.5-tiny.json"
WRITE_TIMEOUT = 30.0
SETTLE = 3.0  # load before the kill and after the part is back


def wait_for(pred, timeout: float, what: str, interval: float = 0.5):
    """The harness's ``wait_for``; a failed request or a missing field means "not yet"."""
    return _wait_for(pred, timeout, what, interval, ignore=(httpx.HTTPError, OSError, ValueError, KeyError))


def docker(*args: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], input=stdin, capture_output=True, timeout=timeout)


class Writers:
    """One thread per writer (name -> container) writing files into `directory` until stopped."""

    def __init__(self, writers: dict[str, str], directory: str, acked: dict[str, str], tag: str):
        self.writers, self.directory, self.acked, self.tag = writers, directory, acked, tag
        self.attempted = 0
        self.failed: list[str] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in writers]

    def _run(self, writer: str) -> None:
        n = 0
        while not self.stopping.is_set():
            n += 1
            name = f"{self.tag}-{writer}-{n}-{secrets.token_hex(3)}.bin"
            data = os.urandom(1024 + int.from_bytes(os.urandom(2)))
            path = f"{self.directory}/{name}"
            with self.lock:
                self.attempted += 1
            try:
                out = docker("exec", "-i", self.writers[writer], "sh", "-c", f"cat > {path} && sync {path}",
                             stdin=data, timeout=WRITE_TIMEOUT)
                ok = out.returncode == 0
                why = out.stderr.decode(errors="replace").strip()[-200:]
            except subprocess.TimeoutExpired:
                ok, why = False, f"no answer in {WRITE_TIMEOUT} s"
            with self.lock:
                if ok:
                    self.acked[name] = hashlib.sha256(data).hexdigest()
                else:
                    self.failed.append(f"{name}: {why}")
            time.sleep(0.2)

    def start(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(WRITE_TIMEOUT + 30)


class Probes:
    """GET /api/v1/nodes 4 times a second: (time, ok), and `node`'s (time, state, boot_id)."""

    def __init__(self, api: Api, node: str):
        self.api, self.node = api, node
        self.seen: list[tuple[float, bool]] = []
        self.states: list[tuple[float, str, str | None]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopping.is_set():
            t = time.monotonic()
            try:
                r = self.api("/api/v1/nodes", timeout=5)
                ok = r.status_code == 200
                if ok:
                    n = next((n for n in r.json()["items"] if n["id"] == self.node), None)
                    if n is not None:
                        self.states.append((t, n["state"], n.get("boot_id")))
            except (httpx.HTTPError, ValueError):
                ok = False
            self.seen.append((t, ok))
            time.sleep(0.25)

    def start(self) -> Probes:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(15)

    def errors(self, t0: float, t1: float) -> tuple[int, int]:
        window = [ok for t, ok in self.seen if t0 <= t <= t1]
        return sum(not ok for ok in window), len(window)


def sums_on(container: str, directory: str, names: list[str]) -> dict[str, str]:
    """sha256 of each named file in `directory` as `container` reads it (a missing file is absent)."""
    out = docker("exec", "-i", container, "sh", "-c", f"cd {directory} && xargs -0 sha256sum",
                 stdin="\0".join(names).encode(), timeout=300)
    got = {}
    for line in out.stdout.decode(errors="replace").splitlines():
        digest, _, name = line.partition("  ")
        got[name] = digest
    return got


def check_files(agents: dict[str, str], directory: str, acked: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """Every acknowledged file on every agent (name -> container): {agent: {"lost": [...],
    "changed": [...]}} for the agents where something is wrong (empty when all is well)."""
    names = sorted(acked)
    bad = {}
    for agent, container in agents.items():
        got = sums_on(container, directory, names)
        lost = [n for n in names if n not in got]
        changed = [n for n in names if n in got and got[n] != acked[n]]
        if lost or changed:
            bad[agent] = {"lost": lost, "changed": changed}
    return bad


def settled_check(agents: dict[str, str], directory: str, acked: dict[str, str],
                  wait: float = 60) -> dict[str, dict[str, list[str]]]:
    """`check_files`, again for up to `wait` s while something is wrong (a file just
    written may take a moment to be everywhere)."""
    deadline = time.monotonic() + wait
    while (bad := check_files(agents, directory, acked)) and time.monotonic() < deadline:
        time.sleep(5)
    return bad


def report_line(part: str, target: str, back: float, bound: float, writers: Writers, mine: int,
                bad: dict[str, dict[str, list[str]]], total: int, errors: int, probed: int) -> str:
    lost = {n for v in bad.values() for n in v["lost"]}
    changed = {n for v in bad.values() for n in v["changed"]}
    return (f"{part:<14} {target:<18} back in {back:5.1f} s (bound {bound:.0f} s)  "
            f"writes attempted {writers.attempted} / acknowledged {mine} / lost {len(lost)} / "
            f"changed {len(changed)} (all files so far: {total})  "
            f"API errors during the outage {errors}/{probed} ({100 * errors / max(probed, 1):.0f} %)")


def post_workflow(api: Api, nodes: list[str]) -> dict:
    """The tiny WfFormat instance POSTed as a manifest over `nodes` (no plans)."""
    r = api("/api/v1/manifests", "POST", params={"nodes": ",".join(nodes), "plans": "false"},
            json=json.loads(TINY.read_text()), timeout=60)
    assert r.status_code == 201, r.text
    manifest = r.json()
    assert len(manifest["jobs"]) >= 6, manifest["jobs"]
    return manifest


def job_step(api: Api, mid: int, job: str, what: str) -> dict:
    """POST …/jobs/JOB/start|finish until it answers 200 (a runner retrying)."""
    def done():
        r = api(f"/api/v1/manifests/{mid}/jobs/{job}/{what}", "POST", timeout=15)
        return r.status_code == 200 and r.json()
    return wait_for(done, 120, f"POST …/jobs/{job}/{what} answered 200", interval=1)


def check_workflow(api: Api, manifest: dict, finished: dict[str, str]) -> None:
    """No job lost or moved, every finished job done once: finishing one again answers the
    same result (a runner retrying after an outage), starting it again 409."""
    got = api(f"/api/v1/manifests/{manifest['id']}").json()
    assert got["placement"] == manifest["placement"]
    assert [(j["id"], j["node"]) for j in got["jobs"]] == [(j["id"], j["node"]) for j in manifest["jobs"]]
    jobs = {j["id"]: j for j in got["jobs"]}
    for job, finished_at in finished.items():
        assert jobs[job]["state"] == "done" and jobs[job]["finished_at"] == finished_at, jobs[job]
    job = next(iter(finished))
    again = api(f"/api/v1/manifests/{manifest['id']}/jobs/{job}/finish", "POST")
    assert again.status_code == 200 and again.json()["finished_at"] == finished[job], again.text
    assert api(f"/api/v1/manifests/{manifest['id']}/jobs/{job}/start", "POST").status_code == 409
    assert api("/api/v1/manifests").json()["total"] == 1


def last_event_id(api: Api) -> int:
    items = api("/api/v1/events", params={"limit": 1}).json()["items"]
    return max((e["id"] for e in items), default=0)


def api_says_what_happened(api: Api, probes: Probes, t0: float, boot: str | None, since: int) -> None:
    """The probed node in the API after its crash: a new boot_id, a `restarted` node event
    naming the old and the new boot, and every state it was seen in other than `up`
    (degraded, then down once its DHT registry entry aged out) in the node events,
    followed by `up`."""
    node = probes.node
    after = [(t - t0, state, b) for t, state, b in probes.states if t >= t0]
    gone = [state for _, state, b in after if state != "up"]
    reboot = next((t for t, state, b in after if b != boot and state == "up"), None)
    assert reboot is not None, after[-5:]

    def events() -> list[dict]:
        return api("/api/v1/events", params={"kind": "node", "node": node, "since_id": since,
                                             "limit": 100}).json()["items"]
    print(f"{node} in the API: up with a new boot_id {reboot:.1f} s after the kill; states seen "
          f"{sorted(set(gone)) or 'only up'}; node events: {[e['detail'] for e in events()] or 'none'}")
    wait_for(lambda: [e for e in events() if e["action"] == "restarted" and e["detail"].startswith(f"boot {boot} -> ")]
             or None, 60, f"{node}'s restart in /api/v1/events")
    if gone:
        def told():
            results = [e["result"] for e in events()]
            first = next((i for i, r in enumerate(results) if r in gone), None)
            return first is not None and "up" in results[first:] and results
        wait_for(told, 60, f"{node}'s node events: {sorted(set(gone))}, then up")
