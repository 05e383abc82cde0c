"""End to end: two real agents (FUSE mounts) on the real Redis Cluster, linked to a real
control plane: nodes up, a written file in /files, pin/promote/demote through the API as
``hycache-agent where`` sees them, a policy change reaching the agent, kill -> down,
restart -> up."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from hycache_harness import cluster_secret, executable, free_port, wait_for, write_secret

from .conftest import make_token, redis_seeds

REPO = Path(__file__).resolve().parents[2]
AGENT = executable("hycache-agent")



def where(path: Path) -> str:
    out = subprocess.run([AGENT, "where", str(path)], capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.split()[0]


def agent_status(m) -> dict:
    out = subprocess.run([AGENT, "status", str(m.root), "--json"], capture_output=True, text=True, check=True,
                         timeout=60)
    return json.loads(out.stdout)


@pytest.mark.mount
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_two_agents_linked_to_the_control_plane(hycache_mount, redis_cluster, dht_namespace, control_server,
                                                 db_url, tmp_path):
    redis = redis_seeds(redis_cluster)
    srv = control_server(db_url, "--redis", redis, "--dht-namespace", dht_namespace, "--heartbeat-interval", "0.5")
    secret = cluster_secret(tmp_path / "cluster.secret")
    mounts = {}
    for name in ("a", "b"):
        tok = write_secret(tmp_path / f"{name}.token", make_token(db_url, "node", f"node-{name}", name))
        mounts[name] = hycache_mount(fast_capacity="64M", redis=redis, dht_namespace=dht_namespace, node_id=name,
                                     listen=f"127.0.0.1:{free_port()}", cluster_secret_file=secret,
                                     control_plane=srv.url, control_token_file=tok)
    a, b = mounts["a"], mounts["b"]
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {srv.admin}"}, timeout=30) as c:
        def node(n):
            r = c.get(f"/api/v1/nodes/{n}")
            return r.json() if r.status_code == 200 else None

        for n in ("a", "b"):
            wait_for(lambda: (node(n) or {}).get("state") == "up" and node(n)["heartbeats"] > 0, 60, f"{n} up")
        # the control plane's view agrees with the agent's own status
        st = agent_status(a)
        view = node("a")
        assert view["tiers"]["fast"]["capacity"] == st["tiers"]["fast"]["capacity"]
        assert view["policy"]["policy"] == st["policy"]
        # HCCache (on by default) and passthrough as the agent reports them
        assert view["hccache"]["mode"] == st["hccache"]["mode"] == "hybrid"
        assert view["hccache"]["limit_bytes"] == st["hccache"]["limit_bytes"] == 256 << 20
        # (the passthrough probe runs after the mount: a heartbeat may predate its answer)
        wait_for(lambda: node("a")["passthrough"] == agent_status(a)["passthrough"], 30, "passthrough state")

        # a file written through a's mount shows in /files with its node and tier
        (a.mountpoint / "f.bin").write_bytes(b"x" * 200_000)
        entry = wait_for(lambda: next((e for e in c.get("/api/v1/files", params={"path": "/"}).json()["items"]
                                       if e["name"] == "f.bin"), None), 60, "f.bin in /files")
        assert entry["primary"] == "a" and entry["size"] == 200_000 and entry["tier"] in ("fast", "slow")

        def act(action):
            r = c.post("/api/v1/files/actions", json={"action": action, "paths": ["/f.bin"]})
            assert r.status_code == 202, r.text
            aid = r.json()["id"]
            done = wait_for(lambda: (x := c.get(f"/api/v1/actions/{aid}").json())["state"] in ("done", "failed") and x,
                            60, f"{action} to finish")
            assert done["state"] == "done", done
            assert done["items"][0]["node"] == "a"
            return done

        act("demote")
        wait_for(lambda: where(a.mountpoint / "f.bin") == "slow", 30, "f.bin on the slow tier")
        act("promote")
        wait_for(lambda: where(a.mountpoint / "f.bin") == "fast", 30, "f.bin on the fast tier")
        act("pin")
        wait_for(lambda: c.get("/api/v1/files/info", params={"path": "/f.bin"}).json()["pinned"], 30, "f.bin pinned")
        act("unpin")

        # a policy change reaches the running agent
        r = c.put("/api/v1/nodes/a/policy", json={"policy": "lfu", "high_watermark": 0.8, "low_watermark": 0.5})
        assert r.status_code == 200 and r.json()["version"] == 1
        wait_for(lambda: c.get("/api/v1/nodes/a/policy").json()["applied_version"] == 1, 30, "policy applied")
        st = agent_status(a)
        assert st["policy"] == "lfu" and st["watermarks"] == {"high": 0.8, "low": 0.5}

        # kill b: down (its heartbeats stop and its registry entry ages out); restart: up
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait(timeout=30)
        wait_for(lambda: node("b")["state"] == "down", 60, "b down")
        b2 = hycache_mount.remount(b, after_kill=True)
        wait_for(lambda: node("b")["state"] == "up", 60, "b up again")
        assert node("b")["boot_id"] and b2.proc.poll() is None
        kinds = [(e["node"], e["result"]) for e in c.get("/api/v1/events", params={"kind": "node", "node": "b",
                                                                                    "limit": 50}).json()["items"]]
        assert ("b", "down") in kinds and ("b", "up") in kinds
