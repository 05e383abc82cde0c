"""The agent's side of the control-plane link (issue 8): counters, the link's logic
(heartbeat, actions, acknowledgements, policies), the token file check, /metrics and the
fast tier's default capacity.

The link's HTTP round trip needs the control plane (tested end to end after both branches
are merged); here its logic runs with real engines (tests/agent/harness.py) and real
mounts, without a fake server.
"""

from __future__ import annotations

import json
import os
import stat

import httpx
import pytest
import trio
from hycache_agent.control.link import ControlLink, TokenFileError, load_token
from hycache_agent.fs import tiers as T
from hycache_agent.fs.placement import POLICY_FILE
from hycache_agent.metrics import render_snapshot
from hycache_harness import free_port
from prometheus_client.parser import text_string_to_metric_families

from .conftest import cli, status, wait_for, wait_idle
from .harness import run_engine

K = 1 << 10
M = 1 << 20


def link_for(engine) -> ControlLink:
    return ControlLink(engine, "http://control.invalid:8000", "t0ken", node_id="n1", address=None)


async def answer(link: ControlLink, sent: dict | None = None, **fields) -> None:
    """Hand the link an answer and wait until the actions it started are finished."""
    async with trio.open_nursery() as nursery:
        await link.handle_answer({"interval": 1.0, "policy": None, "actions": [], "acked_results": [],
                                  "plans": [], **fields}, nursery, sent=sent)


# --------------------------------------------------------------------------- counters (engine)
def test_counters_count_reads_writes_hits_and_misses_per_tier(tmp_path):
    async def body(h):
        e = h.engine
        c0 = e.counters_dict()
        assert c0["fast"] == {"read_bytes": 0, "write_bytes": 0, "reads": 0, "writes": 0, "hits": 0,
                              "kernel_read_bytes": 0, "grown_bytes": 0}
        ino = await h.write_file(b"f", b"x" * (300 * K))  # 3 writes of 128 KiB at most
        c = e.counters_dict()
        assert c["fast"]["write_bytes"] == 300 * K and c["fast"]["writes"] == 3
        assert c["fast"]["hits"] == 0 and c["misses"] == 0  # create is neither
        assert await h.read_file(ino) == b"x" * (300 * K)
        c = e.counters_dict()
        assert c["fast"]["read_bytes"] == 300 * K and c["fast"]["hits"] == 1 and c["misses"] == 0
        assert c["slow"]["read_bytes"] == 0
        # on the slow tier (no promotion on open): a miss, bytes counted on the slow tier
        assert await e.move(h.ns.get(ino), T.SLOW) is None
        c = e.counters_dict()
        assert c["migrations"] == 1 and c["migration_bytes"] == 300 * K
        assert await h.read_file(ino) == b"x" * (300 * K)
        c = e.counters_dict()
        assert c["slow"]["read_bytes"] == 300 * K and c["slow"]["hits"] == 1 and c["misses"] == 1
        assert c["fast"]["read_bytes"] == 300 * K and c["fast"]["hits"] == 1
        fh = await h.open(ino, os.O_WRONLY)  # a write-only open is no hit or miss
        await h.write(fh, 300 * K, b"y" * 10)
        await h.close(fh)
        c = e.counters_dict()
        assert c["slow"]["write_bytes"] == 10 and c["slow"]["writes"] == 1 and c["misses"] == 1
        before = c["metadata_ops"]
        await h.mkdir(b"d")
        await h.lookup(b"f")
        assert e.counters_dict()["metadata_ops"] == before + 2
        st = await e.status()
        assert st["counters"] == e.counters_dict()
        return True

    assert run_engine(tmp_path, body, fast_capacity=4 * M, promote_on_open=False)


def test_polled_status_may_reuse_the_census_but_counters_are_always_current(tmp_path):
    async def body(h):
        e = h.engine
        await h.write_file(b"a", b"1" * 10)
        st = await e.status(max_age=60)
        assert st["tiers"]["fast"]["files"] == 1
        await h.write_file(b"b", b"2" * 20)
        polled = await e.status(max_age=60)
        assert polled["tiers"]["fast"]["files"] == 1  # the census of a moment ago
        assert polled["counters"]["fast"]["write_bytes"] == 30  # counters: never stale
        assert (await e.status())["tiers"]["fast"]["files"] == 2  # the CLI's: exact
        return True

    assert run_engine(tmp_path, body, fast_capacity=M)


# --------------------------------------------------------------------------- the link's logic
def test_heartbeat_carries_status_counters_and_pending_results(tmp_path):
    async def body(h):
        e = h.engine
        link = link_for(e)
        await h.write_file(b"f", b"a" * 1000)
        hb = link.build_heartbeat(await link.agent_status())
        assert hb["node_id"] == "n1" and hb["seq"] == 1 and hb["address"] is None
        assert hb["boot_id"] == link.boot_id and len(hb["boot_id"]) == 36
        assert hb["counters"] == e.counters_dict() and hb["counters"]["fast"]["write_bytes"] == 1000
        assert hb["status"]["control"]["url"] == "http://control.invalid:8000"
        assert hb["status"]["control"]["state"] == "connecting"
        assert hb["policy_version"] == 0 and hb["action_results"] == []
        assert link.build_heartbeat(await link.agent_status())["seq"] == 2
        json.dumps(hb)  # serializable as is
        # a control plane that never acknowledges: each heartbeat stays bounded, oldest first
        link.pending = {i: {"id": i, "state": "done", "detail": "fast", "tier": "fast"} for i in range(1500)}
        results = link.build_heartbeat(await link.agent_status())["action_results"]
        assert [r["id"] for r in results] == list(range(1000))
        assert link_for(e).boot_id != link.boot_id
        return True

    assert run_engine(tmp_path, body, fast_capacity=M)


def test_a_broken_push_channel_falls_back_to_the_heartbeat_and_says_so_once(tmp_path, caplog):
    """Nothing listens on port 9: the plan long-poll fails, is retried with back-off, and
    one warning says the steps come with the heartbeat answers; a push answer's actions
    start like a heartbeat answer's, once per id."""
    async def body(h):
        link = ControlLink(h.engine, "http://127.0.0.1:9", "t0ken", node_id="n1", address=None)
        assert link.status_dict()["push"] == "connecting"
        async with httpx.AsyncClient() as client:
            with trio.move_on_after(3.5):  # tries at 0, 1 and 3 s
                await link.poll_plans(client)
        assert link.push_state == "broken" and link.status_dict()["push"] == "broken"
        assert link.push_version is None and link.pushed_actions == 0
        off = ControlLink(h.engine, "http://127.0.0.1:9", "t0ken", node_id="n1", address=None, push=False)
        assert off.status_dict()["push"] == "off"
        # what a push answer brings goes through the same path as a heartbeat answer's actions
        await h.write_file(b"f", b"a" * 1000)
        async with trio.open_nursery() as nursery:
            acts = [{"id": 7, "action": "pin", "path": "/f"}]
            assert await link.start_actions(acts, nursery) == 1
            assert await link.start_actions(acts, nursery) == 0
        assert link.pending[7]["state"] == "done"
        return True

    import logging
    with caplog.at_level(logging.INFO, logger="hycache_agent.control.link"):
        assert run_engine(tmp_path, body, fast_capacity=M)
    broken = [r for r in caplog.records if "plan push channel broken" in r.getMessage()]
    assert len(broken) == 1 and broken[0].levelname == "WARNING"
    assert "heartbeat answers" in broken[0].getMessage()


def test_actions_apply_through_the_engine_once_and_results_stay_until_acked(tmp_path):
    async def body(h):
        e = h.engine
        link = link_for(e)
        d = await h.mkdir(b"d")
        ino = await h.write_file(b"f", b"z" * (64 * K), parent=d)
        await answer(link, interval=2.5, actions=[
            {"id": 1, "action": "pin", "path": "/d/f"},
            {"id": 2, "action": "demote", "path": "/d/f"},
            {"id": 3, "action": "promote", "path": "/d/nope"},
            {"id": 4, "action": "pin", "path": "/d"},
            {"id": 5, "action": "explode", "path": "/d/f"},
        ])
        assert link.interval == 2.5
        r = link.pending
        assert r[1]["state"] == "done" and r[1]["pinned"] is True
        assert await h.getxattr(ino, b"user.hycache.pinned") == b"1"  # what `where` shows
        assert r[2] == {"id": 2, "state": "done", "detail": "slow", "tier": "slow"}
        assert h.tier(ino) == T.SLOW
        assert r[3]["state"] == "failed" and r[3]["detail"] == "no such file on this node: /d/nope"
        assert r[4]["state"] == "failed" and "not a regular file" in r[4]["detail"]
        assert r[5]["state"] == "failed" and "unknown action" in r[5]["detail"]
        await h.check()

        # the results ride on every heartbeat until the control plane acknowledges them
        hb = link.build_heartbeat(await link.agent_status())
        assert sorted(x["id"] for x in hb["action_results"]) == [1, 2, 3, 4, 5]
        await answer(link, acked_results=[1, 2, 3])
        assert sorted(x["id"] for x in link.build_heartbeat(await link.agent_status())["action_results"]) == [4, 5]

        # unpin, then the old pin delivered again: applied once only, the file stays unpinned
        await answer(link, actions=[{"id": 6, "action": "unpin", "path": "/d/f"},
                                    {"id": 7, "action": "promote", "path": "/d/f"}])
        assert link.pending[6]["state"] == "done" and not h.ns.get(ino).pinned
        assert link.pending[7] == {"id": 7, "state": "done", "detail": "fast", "tier": "fast"}
        assert h.tier(ino) == T.FAST
        await answer(link, actions=[{"id": 1, "action": "pin", "path": "/d/f"},
                                    {"id": 2, "action": "demote", "path": "/d/f"}])
        assert not h.ns.get(ino).pinned and h.tier(ino) == T.FAST
        assert 1 not in link.pending  # acknowledged, not re-run
        assert await h.getxattr(ino, b"user.hycache.tier") == b"fast"
        # a plan step the control plane retries (it failed for room) comes again with
        # attempt 1: applied again, once
        await answer(link, acked_results=[4, 5, 6, 7], actions=[{"id": 8, "action": "prefetch", "path": "/d/nope",
                                                                 "manifest_id": 1, "job": "j", "step": 1}])
        assert link.pending[8]["state"] == "failed" and link.pending[8]["job"] == "j"
        await answer(link, acked_results=[8])
        await h.write_file(b"nope", b"n" * K, parent=d)
        await answer(link, actions=[{"id": 8, "action": "prefetch", "path": "/d/nope", "manifest_id": 1, "job": "j",
                                     "step": 1, "attempt": 1}])
        assert link.pending[8]["state"] == "done" and link.pending[8]["step"] == 1
        await answer(link, acked_results=[8], actions=[{"id": 8, "action": "prefetch", "path": "/d/nope",
                                                        "attempt": 1}])
        assert 8 not in link.pending
        # the retry can come (by push) before the answer that acknowledges the first
        # attempt's result: that acknowledgement must not drop the new attempt's result
        await answer(link, actions=[{"id": 10, "action": "prefetch", "path": "/d/gone", "manifest_id": 1,
                                     "job": "j", "step": 2}])
        first = link.pending[10]
        hb = link.build_heartbeat(await link.agent_status())
        sent = {r["id"]: r for r in hb["action_results"]}
        assert sent[10] is first and first["state"] == "failed"
        await h.write_file(b"gone", b"g" * K, parent=d)
        await link.start_actions([{"id": 10, "action": "prefetch", "path": "/d/gone", "manifest_id": 1, "job": "j",
                                   "step": 2, "attempt": 1}])  # the push channel, before the answer
        assert link.pending[10]["state"] == "done"
        await answer(link, acked_results=[10], sent=sent)
        assert link.pending[10]["state"] == "done"  # kept: the next heartbeat reports it
        await answer(link, acked_results=[10], sent={r["id"]: r for r in link.build_heartbeat(await link.agent_status())
                                                     ["action_results"]})
        assert 10 not in link.pending
        # the fast tier's census carries its pinned bytes (layer 2 plans around them)
        assert (await e.status())["tiers"]["fast"]["pinned_bytes"] == 0
        await answer(link, actions=[{"id": 9, "action": "pin", "path": "/d/nope"}])
        assert link.pending[9]["state"] == "done" and h.tier(h.ns.resolve(b"/d/nope").ino) == T.FAST
        assert (await e.status())["tiers"]["fast"]["pinned_bytes"] == K
        return True

    assert run_engine(tmp_path, body, fast_capacity=M)


def test_promote_without_room_fails_with_the_reason(tmp_path):
    async def body(h):
        e = h.engine
        link = link_for(e)
        ino = await h.write_file(b"big", b"b" * (200 * K))
        assert await e.move(h.ns.get(ino), T.SLOW) is None
        e.capacity = 100 * K  # the fast tier shrank below the file
        await answer(link, actions=[{"id": 9, "action": "promote", "path": "/big"}])
        assert link.pending[9]["state"] == "failed" and "no room" in link.pending[9]["detail"]
        assert h.tier(ino) == T.SLOW
        e.capacity = M
        return True

    assert run_engine(tmp_path, body, fast_capacity=M)


def test_policy_from_the_answer_applies_live_and_is_kept_across_restarts(tmp_path):
    async def body(h):
        e = h.engine
        link = link_for(e)
        inos = [await h.write_file(f"f{i}".encode(), bytes(100 * K)) for i in range(5)]
        for ino in reversed(inos):  # recency: f4 … f0 (f0 most recent)
            await h.read_file(ino)
        await e.set_pinned(h.ns.get(inos[0]), True)
        assert e.policy.name == "lru"
        await answer(link, policy={"version": 3, "policy": "lfu", "high_watermark": 0.8, "low_watermark": 0.6})
        assert e.policy.name == "lfu" and e.policy_version == 3
        assert (e.config.high_watermark, e.config.low_watermark) == (0.8, 0.6)
        assert sorted(e.policy.eviction_order()) == sorted(inos)  # every fast file re-admitted
        saved = json.loads((e.config.state_dir / POLICY_FILE).read_text())
        assert saved == {"version": 3, "policy": "lfu", "high_watermark": 0.8, "low_watermark": 0.6}
        hb = link.build_heartbeat(await link.agent_status())
        assert hb["policy_version"] == 3 and hb["status"]["policy"] == "lfu"

        # back to LRU: the queue is rebuilt in recency order
        await answer(link, policy={"version": 4, "policy": "lru", "high_watermark": 0.9, "low_watermark": 0.7})
        assert h.fast_order() == list(reversed(inos))

        # invalid settings change nothing and are reported
        for bad in ({"version": 5, "policy": "lru", "high_watermark": 0.5, "low_watermark": 0.6},
                    {"version": 6, "policy": "no-such-policy", "high_watermark": 0.9, "low_watermark": 0.5}):
            await answer(link, policy=bad)
            assert e.policy_version == 4 and e.policy.name == "lru" and link.policy_error
        assert "unknown policy 'no-such-policy'" in (await link.agent_status())["control"]["policy_error"]

        # a lower high mark starts the evictor at once; the pinned file stays
        await answer(link, policy={"version": 7, "policy": "lru", "high_watermark": 0.3, "low_watermark": 0.2})
        with trio.fail_after(30):
            while e.fast_used > 0.2 * e.capacity or e.active:
                await trio.sleep(0.02)
        assert h.tier(inos[0]) == T.FAST and h.ns.get(inos[0]).pinned
        assert sum(h.tier(i) == T.SLOW for i in inos) >= 3
        return True

    assert run_engine(tmp_path, body, fast_capacity=M)

    async def after_restart(h):  # the saved policy runs before any control plane answers
        assert h.engine.policy.name == "lru" and h.engine.policy_version == 7
        assert (h.engine.config.high_watermark, h.engine.config.low_watermark) == (0.3, 0.2)
        st = await h.engine.status()
        assert st["policy_version"] == 7 and st["watermarks"] == {"high": 0.3, "low": 0.2}
        return True

    assert run_engine(tmp_path, after_restart, fast_capacity=M, policy="lfu")


# --------------------------------------------------------------------------- token file
def test_token_file_must_be_private_and_ours(tmp_path):
    f = tmp_path / "token"
    f.write_text("hcn_secret-token\n")
    for mode in (0o600, 0o400):
        f.chmod(mode)
        assert load_token(f) == "hcn_secret-token"
    for mode in (0o640, 0o604, 0o644, 0o660, 0o700):
        f.chmod(mode)
        with pytest.raises(TokenFileError, match="0600 or stricter"):
            load_token(f)
    f.chmod(0o600)
    os.chown(f, 4242, -1)
    with pytest.raises(TokenFileError, match="owned by uid 4242"):
        load_token(f)
    os.chown(f, os.geteuid(), -1)
    f.write_text("  \n")
    with pytest.raises(TokenFileError, match="one token"):
        load_token(f)
    with pytest.raises(TokenFileError, match="No such file"):
        load_token(tmp_path / "missing")
    with pytest.raises(TokenFileError, match="not a regular file"):
        load_token(tmp_path)


@pytest.mark.mount
def test_agent_refuses_an_open_token_file_and_reports_the_link(hycache_mount, shared_tmp_path):
    tok = shared_tmp_path / "node.token"
    tok.write_text("hcn_0123456789abcdef\n")
    tok.chmod(0o644)
    root, mnt = shared_tmp_path / "root", shared_tmp_path / "mnt"
    root.mkdir()
    mnt.mkdir()
    p = cli("mount", root, mnt, "--control-plane", "http://127.0.0.1:9", "--control-token-file", tok, timeout=60)
    assert p.returncode != 0 and "mode 0644" in p.stderr and "0600" in p.stderr, p.stderr
    assert not os.path.ismount(mnt)
    p = cli("mount", root, mnt, "--control-plane", "http://127.0.0.1:9", timeout=60)
    assert p.returncode == 2 and "control_token_file" in p.stderr

    tok.chmod(0o600)
    # nothing listens on port 9: the agent serves files and reports the link unreachable
    m = hycache_mount(control_plane="http://127.0.0.1:9", control_token_file=tok, node_id="cp-node")
    (m.mountpoint / "f").write_bytes(b"still serving")
    st = wait_for(lambda: (s := status(m))["control"]["state"] == "unreachable" and s, 30, "link unreachable")
    ctl = st["control"]
    assert ctl["url"] == "http://127.0.0.1:9" and ctl["heartbeats_sent"] >= 1 and ctl["last_ok"] is None
    assert "ConnectError" in ctl["last_error"]
    assert (m.mountpoint / "f").read_bytes() == b"still serving"
    assert "control plane http://127.0.0.1:9: unreachable" in cli("status", m.root, check=True).stdout
    assert m.stderr.count("unreachable (") == 1  # one warning per state change, not per retry


# --------------------------------------------------------------------------- mounts
@pytest.mark.mount
def test_counters_on_a_mount(hycache_mount):
    # the agent counts every byte it serves (with kernel passthrough the kernel moves them:
    # tests/agent/test_tier_bytes.py)
    m = hycache_mount("1G", no_kernel_cache=True, no_promote_on_open=True, passthrough="off")
    f = m.mountpoint / "data.bin"
    payload = os.urandom(256 * K)
    f.write_bytes(payload)
    c = status(m)["counters"]
    assert c["fast"]["write_bytes"] == 256 * K and c["slow"]["write_bytes"] == 0
    assert f.read_bytes() == payload
    c = status(m)["counters"]
    assert c["fast"]["read_bytes"] == 256 * K and c["fast"]["hits"] == 1 and c["misses"] == 0
    cli("demote", f, check=True)
    wait_idle(m)
    assert f.read_bytes() == payload  # from the slow tier: a miss
    c = status(m)["counters"]
    assert c["slow"]["read_bytes"] == 256 * K and c["slow"]["hits"] == 1 and c["misses"] == 1
    assert c["fast"]["read_bytes"] == 256 * K and c["fast"]["hits"] == 1
    assert c["migrations"] == 1 and c["migration_bytes"] == 256 * K
    assert c["evicted_bytes"] == 256 * K and c["promoted_bytes"] == 0
    ops = c["metadata_ops"]
    os.mkdir(m.mountpoint / "d")
    os.listdir(m.mountpoint / "d")
    assert status(m)["counters"]["metadata_ops"] >= ops + 2
    out = json.loads(cli("status", m.root, "--json", check=True).stdout)
    assert set(out["counters"]) == {"fast", "slow", "remote", "misses", "metadata_ops", "migrations",
                                    "migration_bytes", "promoted_bytes", "evicted_bytes", "counting"}
    # passthrough off: the agent served every byte it counts
    assert out["counters"]["counting"]["passthrough"] is False and out["counters"]["counting"]["reads"] == "agent"



def scrape(url: str) -> dict[str, dict[tuple, float]]:
    text = httpx.get(url, timeout=10).raise_for_status().text
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.mark.mount
def test_metrics_standalone_parse_and_follow_the_counters(hycache_mount):
    port = free_port()
    m = hycache_mount("1G", no_kernel_cache=True, metrics_listen=f"127.0.0.1:{port}", passthrough="off")
    (m.mountpoint / "a").write_bytes(b"q" * 5000)
    assert (m.mountpoint / "a").read_bytes() == b"q" * 5000
    got = scrape(f"http://127.0.0.1:{port}/metrics")
    st = status(m)
    assert got["hycache_write_bytes_total"][(("tier", "fast"),)] == 5000
    assert got["hycache_read_bytes_total"][(("tier", "fast"),)] == 5000
    assert got["hycache_hits_total"][()] == 1 and got["hycache_misses_total"][()] == 0
    assert got["hycache_capacity_bytes"][(("tier", "fast"),)] == st["tiers"]["fast"]["capacity"] == 1 << 30
    assert got["hycache_files"][(("tier", "fast"),)] == 1
    assert got["hycache_metadata_ops_total"][()] >= 1
    for name in ("hycache_migrations_total", "hycache_migration_bytes_total", "hycache_remote_fetches_total",
                 "hycache_dht_backlog", "hycache_used_bytes", "hycache_device_capacity_bytes",
                 "hycache_kernel_read_bytes_total", "hycache_grown_bytes_total", "hycache_promoted_bytes_total",
                 "hycache_evicted_bytes_total", "hycache_migration_promotions_declined_total"):
        assert name in got, name
    assert httpx.get(f"http://127.0.0.1:{port}/other", timeout=10).status_code == 404


@pytest.mark.mount
def test_metrics_on_the_peer_service_without_authentication(hycache_mount, shared_tmp_path):
    secret = shared_tmp_path / "secret"
    secret.write_text("s" * 32)
    secret.chmod(0o600)
    port = free_port()
    m = hycache_mount("1G", meta_store=shared_tmp_path / "meta.db", cluster_secret_file=secret,
                      node_id="peer-a", listen=f"127.0.0.1:{port}", passthrough="off")
    (m.mountpoint / "x").write_bytes(b"1234")
    got = scrape(f"http://127.0.0.1:{port}/metrics")
    assert got["hycache_write_bytes_total"][(("tier", "fast"),)] == 4
    assert got["hycache_agent_info"][(("node", "peer-a"), ("policy", "lru"))] == 1
    assert ("hycache_dht_state") in got
    # the files endpoint still wants a signature
    assert httpx.get(f"http://127.0.0.1:{port}/v1/files?path=/x", timeout=10).status_code == 401


def test_metrics_render_from_a_status_snapshot(tmp_path):
    async def body(h):
        await h.write_file(b"f", b"m" * 10)
        return await h.engine.status()

    st = run_engine(tmp_path, body, fast_capacity=M)
    st["control"] = {"state": "unauthorized", "heartbeats_sent": 4}
    text = render_snapshot(st, "n9").decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["hycache_write_bytes"].type == "counter"
    state = {s.labels["state"]: s.value for s in fams["hycache_control_link_state"].samples}
    assert state == {"connecting": 0, "ok": 0, "unreachable": 0, "unauthorized": 1}
    assert "hycache_hits_total 0.0" in text


# --------------------------------------------------------------------------- capacity
@pytest.mark.mount
def test_default_fast_capacity_is_own_files_plus_free_space(hycache_mount, tmpfs_dir):
    fast = tmpfs_dir / "fast"
    fast.mkdir()
    (tmpfs_dir / "someone-else").write_bytes(os.urandom(3 * M))  # not ours: not capacity
    m = hycache_mount(None, fast=fast)
    t = status(m)["tiers"]["fast"]
    vfs = os.statvfs(tmpfs_dir)
    assert t["device_capacity"] == vfs.f_blocks * vfs.f_frsize == 8 * M
    assert t["capacity"] <= 5 * M + 64 * K and t["capacity"] >= 4 * M
    assert abs(t["capacity"] - t["device_free"]) <= 64 * K  # nothing of ours yet
    (m.mountpoint / "mine").write_bytes(os.urandom(M))
    m2 = hycache_mount.remount(m)
    t2 = status(m2)["tiers"]["fast"]
    assert t2["used"] == M
    # our 1 MiB file counts as usable capacity, the other tenant's 3 MiB do not
    assert abs(t2["capacity"] - (t2["device_free"] + M)) <= 64 * K
    assert abs(t2["capacity"] - t["capacity"]) <= 64 * K
    assert t2["capacity"] < t2["device_capacity"] - 2 * M
    assert stat.S_ISREG(os.stat(m2.mountpoint / "mine").st_mode)
