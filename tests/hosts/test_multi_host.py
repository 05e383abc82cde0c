"""Agents on separate hosts: each agent runs in its own network namespace with its own
address on a bridge (``netns.py``), the Redis Cluster listens on the bridge address, and
peers fetch files from each other's address across the bridge. Real FUSE mounts (in the
shared mount namespace, so the test reads and writes every mount directly), real Redis,
real peer service."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess

import pytest
from hycache_dht.keys import dir_key
from redis.crc import key_slot

from .conftest import AGENT, PEER_PORT

pytestmark = pytest.mark.mount


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def published(agent) -> bool:
    st = agent.status()
    return st["state"] == "ok" and st["backlog"] == 0


def test_each_host_has_its_own_address_and_follows_redis_redirects(host_network, bridge_redis):
    """The plumbing: every host sees only its own address, and a cluster client inside a
    host follows MOVED redirects to the addresses the Redis nodes announce."""
    for h in host_network.hosts:
        out = h.run(["ip", "-j", "-4", "addr", "show"], check=True)
        addrs = {a["local"] for link in json.loads(out.stdout) for a in link.get("addr_info", [])}
        assert addrs == {"127.0.0.1", h.ip}, (h.name, addrs)
    first = bridge_redis.ports[0]
    keys = [k for k in (f"probe-{i}" for i in range(64)) if bridge_redis.master_of_slot(key_slot(k.encode())) != first]
    assert keys, "every probe key maps to the first master"
    h = host_network.hosts[0]
    for key in keys[:3]:  # each one is MOVED away from the node asked
        argv = ["redis-cli", "-c", "-h", host_network.bridge_ip, "-p", str(first)]
        assert h.run([*argv, "SET", key, h.ip], check=True).stdout.strip() == "OK"
        assert h.run([*argv, "GET", key], check=True).stdout.strip() == h.ip
        assert h.run([*argv, "DEL", key], check=True).stdout.strip() == "1"


def test_a_file_written_on_host_a_is_read_over_the_network_on_host_b(agents):
    a, b = agents.start(0, "a"), agents.start(1, "b")
    agents.check(a.status()["advertise"] == f"{a.host.ip}:{PEER_PORT}", f"a advertises {a.status()}")
    big = os.urandom((3 << 20) + 4321)
    (a.mnt / "results").mkdir()
    (a.mnt / "results" / "big.bin").write_bytes(big)
    (a.mnt / "hello.txt").write_text("hello from host a\n")
    odd = b"caf\xe9-\xff.txt"  # not UTF-8
    with open(os.fsencode(a.mnt) + b"/" + odd, "wb") as f:
        f.write(b"latin-1 name")
    # b looks at nothing before a has published everything: no stale version anywhere
    agents.wait_for(lambda: published(a), "a's outbox drained", describe=a.status)

    expected = sorted(["results", "hello.txt", os.fsdecode(odd)])
    agents.wait_for(lambda: sorted(os.listdir(b.mnt)) == expected, "a's names listed on b",
                    describe=lambda: sorted(os.listdir(b.mnt)))
    agents.check(os.listdir(b.mnt / "results") == ["big.bin"], f"b lists {os.listdir(b.mnt / 'results')}")
    fetches = b.status()["remote_fetches"]
    wire_a, wire_b = a.host.counters(), b.host.counters()

    agents.check(sha((b.mnt / "results" / "big.bin").read_bytes()) == sha(big), "big.bin differs on b")
    with open(os.fsencode(b.mnt) + b"/" + odd, "rb") as f:
        agents.check(f.read() == b"latin-1 name", "the non-UTF-8 name's bytes differ on b")
    agents.check((b.mnt / "hello.txt").read_text() == "hello from host a\n", "hello.txt differs on b")

    st = b.status()
    agents.check(st["state"] == "ok" and st["remote_fetches"] >= fetches + 3 and st["remote_bytes"] >= len(big),
                 f"b's cluster status after the reads: {st}")
    # the bytes crossed the bridge: out of a's cable, into b's
    sent_by_a = a.host.counters()["rx"] - wire_a["rx"]
    received_by_b = b.host.counters()["tx"] - wire_b["tx"]
    agents.check(sent_by_a >= len(big) and received_by_b >= len(big),
                 f"only {sent_by_a} bytes left {a.host.ip}, {received_by_b} reached {b.host.ip}")
    where = subprocess.run([AGENT, "where", str(b.mnt / "hello.txt")],
                           capture_output=True, text=True)
    agents.check(where.stdout.split()[:1] == ["remote"], f"hycache-agent where: {where.stdout}{where.stderr}")

    # a third host joins later and reads the same bytes from a
    c = agents.start(2, "c")
    agents.check(sorted(os.listdir(c.mnt)) == expected, f"c lists {sorted(os.listdir(c.mnt))}")
    wire_c = c.host.counters()
    agents.check(sha((c.mnt / "results" / "big.bin").read_bytes()) == sha(big), "big.bin differs on c")
    agents.check(c.host.counters()["tx"] - wire_c["tx"] >= len(big), f"big.bin did not reach {c.host.ip}")


def test_a_dead_host_is_a_clean_error_until_it_comes_back(agents):
    a, b = agents.start(0, "a"), agents.start(1, "b")
    payload, own = os.urandom(256 << 10), b"b's own bytes"
    (a.mnt / "data").write_bytes(payload)
    (b.mnt / "mine").write_bytes(own)
    agents.wait_for(lambda: published(a) and published(b), "both outboxes drained")
    agents.wait_for(lambda: "data" in os.listdir(b.mnt), "a's file listed on b")

    a.mount.proc.kill()  # kill -9: nsenter exec'd the agent, so this is the agent itself
    a.mount.proc.wait()
    agents.check("data" in os.listdir(b.mnt), "a's name vanished from b's listing (it lives in the DHT)")
    with pytest.raises(OSError) as exc:
        (b.mnt / "data").read_bytes()
    agents.check(exc.value.errno == errno.EIO, f"reading a's file with a dead: {exc.value!r}, not EIO")
    agents.check((b.mnt / "mine").read_bytes() == own, "b's own file is not readable")

    a2 = agents.restart_after_kill(a)
    agents.check(a2.host is a.host and a2.mnt == a.mnt, "restarted elsewhere")
    agents.wait_for(lambda: (b.mnt / "data").read_bytes() == payload, "b reads a's file after a's restart",
                    timeout=60)
    agents.check((a2.mnt / "data").read_bytes() == payload, "a lost its own file over the kill")


def test_a_partitioned_host_serves_locally_queues_and_catches_up_after_the_heal(agents):
    a, b = agents.start(0, "a"), agents.start(1, "b")
    (b.mnt / "before").write_text("written before the partition")
    agents.wait_for(lambda: published(b), "b's outbox drained")
    agents.wait_for(lambda: "before" in os.listdir(a.mnt), "b's file listed on a")

    b.host.partition()
    try:
        offline = {f"offline-{i}": os.urandom(1000 + i) for i in range(10)}
        for name, data in offline.items():
            (b.mnt / name).write_bytes(data)
        agents.check((b.mnt / "before").read_text() == "written before the partition", "b's old file")
        agents.check(all((b.mnt / n).read_bytes() == d for n, d in offline.items()), "b's new files")
        agents.check(set(os.listdir(b.mnt)) >= {"before", *offline}, f"b lists {os.listdir(b.mnt)}")
        st = agents.wait_for(lambda: (s := b.status())["state"] == "degraded" and s["backlog"] > 0 and s,
                             "b degraded with a backlog", timeout=20, describe=b.status)
        agents.check(st["last_error"], f"no last_error in {st}")
    finally:
        b.host.heal()

    agents.wait_for(lambda: published(b), "b's backlog drained after the heal", timeout=60, describe=b.status)
    agents.wait_for(lambda: set(os.listdir(a.mnt)) >= {"before", *offline}, "b's partition-time files on a",
                    describe=lambda: sorted(os.listdir(a.mnt)))
    for name, data in offline.items():  # the kernel may hold an older version for its entry timeout (1 s)
        agents.wait_for(lambda: (a.mnt / name).read_bytes() == data, f"a reads {name} as b wrote it", timeout=15)
    agents.check(published(a) and a.status()["remote_fetches"] >= len(offline), f"a: {a.status()}")


def test_killing_a_redis_master_loses_no_acknowledged_name(agents, bridge_redis):
    a, b = agents.start(0, "a"), agents.start(1, "b")
    (a.mnt / "warm").write_text("x")
    agents.wait_for(lambda: published(a) and "warm" in os.listdir(b.mnt), "first name published")
    # every name below goes into the root directory, whose entries live in one slot:
    # kill the master of that slot, the worst case
    slot = key_slot(dir_key(agents.namespace, b"/"))
    written: dict[str, list[str]] = {"a": [], "b": []}
    killed = None
    try:
        for i in range(90):
            for agent in (a, b):
                name = f"{agent.name}-{i:03d}"
                (agent.mnt / name).write_text(name)
                written[agent.name].append(name)  # acknowledged: close() returned
            if i == 20:
                killed = bridge_redis.kill_master(slot=slot)
        assert killed is not None
        bridge_redis.wait_failover(killed, timeout=60)
        agents.wait_for(lambda: set(os.listdir(b.mnt)) >= set(written["a"]), "every name of a listed on b",
                        timeout=90, describe=lambda: (sorted(set(written["a"]) - set(os.listdir(b.mnt))), a.status()))
        agents.wait_for(lambda: set(os.listdir(a.mnt)) >= set(written["b"]), "every name of b listed on a",
                        timeout=90, describe=lambda: (sorted(set(written["b"]) - set(os.listdir(a.mnt))), b.status()))
        agents.wait_for(lambda: published(a) and published(b), "both outboxes drained", timeout=60,
                        describe=lambda: (a.status(), b.status()))
        agents.wait_for(lambda: (b.mnt / "a-089").read_text() == "a-089", "b reads a's last file", timeout=15)
    finally:
        if killed is not None:
            bridge_redis.start_node(killed)
            bridge_redis.wait_healthy(90)


def test_a_host_that_boots_partitioned_serves_locally_and_joins_after_the_heal(agents):
    """Until its first connection to Redis, an agent serves its own files: a lookup of a
    new name is "unreachable", not EIO (fixed in 5918fe0; before, every create failed)."""
    a = agents.start(0, "a")
    c_host = agents.net.hosts[2]
    c_host.partition()
    try:
        c = agents.start(2, "c", joined=False)
        (c.mnt / "born-offline").write_text("written before c ever reached Redis")
        agents.check((c.mnt / "born-offline").read_text() == "written before c ever reached Redis", "c's file")
    finally:
        c_host.heal()
    agents.wait_for(lambda: published(c), "c joined and published", timeout=60, describe=c.status)
    agents.wait_for(lambda: (a.mnt / "born-offline").read_text() == "written before c ever reached Redis",
                    "a reads c's file", timeout=15)


def test_a_file_whose_host_died_is_taken_over_from_its_replica_on_another_host(agents):
    """Writes are always local, across hosts: a's file has a sync replica; a's host dies;
    c appends to the file, fetching a's bytes from the replica over the network and
    becoming the primary; a, back, learns from its inbox and drops its stale copy."""
    a = agents.start(0, "a", replicas=1, replica_mode="sync")
    b = agents.start(1, "b", replicas=1, replica_mode="sync")
    c = agents.start(2, "c", replicas=1, replica_mode="sync")
    data = os.urandom(2 << 20)
    (a.mnt / "shared.dat").write_bytes(data)
    info = json.loads(os.getxattr(a.mnt / "shared.dat", "user.hycache.info"))
    agents.check(len(info["replicas"]) == 1 and info["replicas"][0] in ("b", "c"), f"replicas: {info}")
    agents.wait_for(lambda: published(a) and (c.mnt / "shared.dat").exists(), "a's file published and seen on c")
    a.mount.proc.kill()  # the host's agent dies with the only primary copy
    a.mount.proc.wait()
    with open(c.mnt / "shared.dat", "ab") as f:
        f.write(b"+c")
    agents.check((c.mnt / "shared.dat").read_bytes() == data + b"+c", "c's takeover kept a's bytes")
    agents.check(c.status()["ownership"]["takeovers"] == 1, f"c status: {c.status()}")
    agents.wait_for(lambda: published(c), "c's takeover published")
    agents.wait_for(lambda: (b.mnt / "shared.dat").read_bytes() == data + b"+c", "b reads c's version")
    a2 = agents.restart_after_kill(a)
    agents.wait_for(lambda: (a2.mnt / "shared.dat").read_bytes() == data + b"+c", "a, back, reads c's version")
    agents.wait_for(lambda: a2.status()["ownership"]["taken_from_us"] == 1, "a dropped its stale copy",
                    describe=a2.status)

