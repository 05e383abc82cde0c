"""Several "hosts" on one machine: Linux network namespaces on a bridge.

    net = HostNetwork(3).create()       # needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN)
    try:
        a = net.hosts[0]                # a.ip == "10.X.Y.10", net.bridge_ip == "10.X.Y.1"
        a.run(["ip", "-br", "addr"])    # a command inside a's network namespace
        a.partition(); a.heal()         # its cable out and back in
    finally:
        net.destroy()

Layout: a bridge ``hyc<id>br`` in the root namespace holds ``10.X.Y.1/24`` (X.Y random,
not overlapping any route or address already on the machine); host ``i`` is the network
namespace ``hyc<id>-<i>`` with ``lo`` up and ``eth0`` = ``10.X.Y.(10+i)/24`` (default route
via the bridge address), the other end of its veth pair, ``hyc<id>v<i>``, being a port of
the bridge. Processes in the root namespace (a Redis Cluster bound to the bridge address,
the test itself) reach every host, and the hosts reach each other, over that bridge.

``<id>`` is the owner's pid (6 hex digits) and 2 random hex digits, so parallel runs never
collide and a later run can tell the leftovers of a dead one (``clean_stale``).

Commands run in a host with ``nsenter --net=/run/netns/NAME`` (:attr:`Host.prefix`), which
changes the network namespace *only*: ``ip netns exec`` also unshares the mount namespace
(to bind /etc/netns/NAME files), so a FUSE mount made by an agent started that way would
be invisible to the test and to the other agents.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "hyc"
# hyc + 6 hex (pid) + 2 hex (random) + a suffix of at most 2 characters: <= 13 < IFNAMSIZ
NAME_RE = re.compile(rf"^{PREFIX}([0-9a-f]{{6}})([0-9a-f]{{2}})(?:br|v\d+|p\d+|-\d+)$")
NETNS_DIR = Path("/run/netns")
MAX_HOSTS = 10


class NetnsError(RuntimeError):
    pass


def _run(argv: list[str], *, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return out


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", *args], check=check)


def _ip_json(*args: str) -> list[dict]:
    out = ip("-j", *args, check=False)
    if out.returncode != 0 or not out.stdout.strip():
        return []
    return json.loads(out.stdout)


def _forward(action: str, bridge: str) -> subprocess.CompletedProcess | None:
    """Add (``-I``) or delete (``-D``) the rule that lets frames between two ports of
    ``bridge`` through the FORWARD chain.  Needed where bridged frames go through
    iptables (``br_netfilter``) and the chain's policy is DROP — which is what a running
    Docker Engine sets up; without iptables there is nothing to open."""
    if shutil.which("iptables") is None:
        return None
    return _run(["iptables", "-w", action, "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"], check=False)


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def unusable_reason() -> str | None:
    """Why network namespaces cannot be made here, or None if they can (a real probe)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    for tool, package in (("ip", "iproute2"), ("bridge", "iproute2"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt package {package})"
    name = f"{PREFIX}{os.getpid() & 0xFFFFFF:06x}{random.randrange(256):02x}-99"
    try:
        out = ip("netns", "add", name, check=False)
        if out.returncode != 0:
            return f"ip netns add failed: {out.stderr.strip()}"
        out = _run(["nsenter", f"--net={NETNS_DIR / name}", "ip", "link", "set", "lo", "up"], check=False)
        if out.returncode != 0:
            return f"nsenter --net into a new namespace failed: {out.stderr.strip()}"
    finally:
        ip("netns", "del", name, check=False)
    return None


def clean_stale() -> list[str]:
    """Delete namespaces, veths and bridges with our prefix whose owner process is gone
    (a run that was killed before its teardown). Returns what was removed."""
    removed = []
    netns = [e["name"] for e in _ip_json("netns", "list")]
    links = [e["ifname"] for e in _ip_json("link", "show")]
    for kind, names in (("link", [n for n in links if not n.endswith("br")]), ("netns", netns),
                        ("link", [n for n in links if n.endswith("br")])):
        for name in names:
            m = NAME_RE.match(name)
            if not m or _pid_alive(int(m.group(1), 16)):
                continue
            if kind == "netns":
                ip("netns", "del", name, check=False)
            else:
                ip("link", "del", name, check=False)
                if name.endswith("br"):
                    _forward("-D", name)
            removed.append(name)
    return removed


def _taken_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for r in _ip_json("-4", "route", "show", "table", "all"):
        dst = r.get("dst")
        if dst and dst != "default":
            try:
                nets.append(ipaddress.ip_network(dst, strict=False))
            except ValueError:
                pass
    for link in _ip_json("-4", "addr", "show"):
        for a in link.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
    return nets


@dataclass
class Host:
    """One network namespace on the bridge."""

    index: int
    name: str  # the namespace: /run/netns/<name>
    ip: str  # its address on the bridge
    veth: str  # the bridge-side end of its cable (in the root namespace)

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.name)

    @property
    def prefix(self) -> list[str]:
        """A command prefix running its argument inside this host's network namespace
        (and nothing else: same mount namespace, same pid namespace, exec, no fork)."""
        return ["nsenter", f"--net={self.netns_path}"]

    def run(self, argv: list[str], *, check: bool = False, timeout: float = 30.0) -> subprocess.CompletedProcess:
        return _run([*self.prefix, *argv], check=check, timeout=timeout)

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen([*self.prefix, *argv], **kwargs)

    def partition(self) -> None:
        """Pull the cable: the bridge side of its veth goes down (the host's eth0 loses
        carrier; packets to and from it are dropped, nobody gets a reset)."""
        ip("link", "set", self.veth, "down")

    def heal(self, timeout: float = 10.0) -> None:
        """Plug the cable back in and wait until the bridge forwards its frames again."""
        ip("link", "set", self.veth, "up")
        deadline = time.monotonic() + timeout
        while not self.connected():
            if time.monotonic() > deadline:
                raise NetnsError(f"{self.name}: link not forwarding {timeout:.0f} s after heal")
            time.sleep(0.05)

    def connected(self) -> bool:
        ports = _run(["bridge", "-j", "link", "show", "dev", self.veth], check=False)
        try:
            state = json.loads(ports.stdout)[0].get("state")
        except (ValueError, IndexError, AttributeError):
            return False
        inner = _ip_json("-n", self.name, "link", "show", "eth0")
        return state == "forwarding" and bool(inner) and inner[0].get("operstate") == "UP"

    def pids(self) -> list[int]:
        out = ip("netns", "pids", self.name, check=False)
        return [int(p) for p in out.stdout.split()]

    def counters(self) -> dict[str, int]:
        """Bytes through its cable as the bridge sees them: rx = sent by the host, tx =
        received by the host."""
        stats = Path("/sys/class/net") / self.veth / "statistics"
        return {k: int((stats / f"{k}_bytes").read_text()) for k in ("rx", "tx")}


@dataclass
class HostNetwork:
    """A bridge and ``count`` hosts (network namespaces) on it."""

    count: int
    id: str = field(default_factory=lambda: f"{os.getpid() & 0xFFFFFF:06x}{random.randrange(256):02x}")
    bridge: str = ""
    subnet: ipaddress.IPv4Network | None = None
    hosts: list[Host] = field(default_factory=list)
    _made: list[tuple[str, str]] = field(default_factory=list)  # ("link"|"netns", name), in creation order

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_HOSTS:
            raise ValueError(f"1..{MAX_HOSTS} hosts")
        self.bridge = f"{PREFIX}{self.id}br"

    @property
    def bridge_ip(self) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    def _pick_subnet(self) -> ipaddress.IPv4Network:
        taken = _taken_networks()
        for _ in range(1000):
            net = ipaddress.ip_network(f"10.{random.randrange(1, 255)}.{random.randrange(256)}.0/24")
            if not any(net.overlaps(t) for t in taken):
                return net
        raise NetnsError("no free 10.x.y.0/24 subnet")

    def create(self) -> HostNetwork:
        """Make the bridge and the hosts; on any failure, undo what was made and raise."""
        try:
            self._create()
        except BaseException:
            self.destroy()
            raise
        return self

    def _create(self) -> None:
        clean_stale()
        if any(e.get("ifname") == self.bridge for e in _ip_json("link", "show")):
            raise NetnsError(f"{self.bridge} exists already")
        ip("link", "add", self.bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0")
        self._made.append(("link", self.bridge))
        for _ in range(5):  # a parallel run may pick the same subnet at the same moment
            self.subnet = self._pick_subnet()
            ip("addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
            others = [a for link in _ip_json("-4", "addr", "show") if link.get("ifname") != self.bridge
                      for a in link.get("addr_info", [])
                      if ipaddress.ip_address(a["local"]) in self.subnet]
            if not others:
                break
            ip("addr", "del", f"{self.bridge_ip}/24", "dev", self.bridge, check=False)
        else:
            raise NetnsError("could not claim a subnet")
        ip("link", "set", self.bridge, "up")
        out = _forward("-I", self.bridge)
        if out is not None:
            if out.returncode != 0:
                raise NetnsError(f"iptables: cannot let the bridge forward: {out.stderr.strip()}")
            self._made.append(("forward", self.bridge))
        for i in range(self.count):
            name = f"{PREFIX}{self.id}-{i}"
            outer, inner = f"{PREFIX}{self.id}v{i}", f"{PREFIX}{self.id}p{i}"
            host_ip = str(self.subnet.network_address + 10 + i)
            ip("netns", "add", name)
            self._made.append(("netns", name))
            ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            self._made.append(("link", outer))  # deleting one end deletes the pair
            ip("link", "set", inner, "netns", name)
            ip("-n", name, "link", "set", inner, "name", "eth0")
            ip("-n", name, "link", "set", "lo", "up")
            ip("-n", name, "addr", "add", f"{host_ip}/24", "dev", "eth0")
            ip("-n", name, "link", "set", "eth0", "up")
            ip("-n", name, "route", "add", "default", "via", self.bridge_ip)
            ip("link", "set", outer, "master", self.bridge)
            ip("link", "set", outer, "up")
            self.hosts.append(Host(i, name, host_ip, outer))
        deadline = time.monotonic() + 10
        for h in self.hosts:
            while not h.connected():
                if time.monotonic() > deadline:
                    raise NetnsError(f"{h.name}: its link never came up")
                time.sleep(0.05)

    def destroy(self) -> list[str]:
        """Remove everything this network made, whatever state it is in (idempotent).
        Processes still running in a host (started by the test and not stopped) are
        killed first, else the namespace would outlive its name. Returns the problems."""
        problems = []
        for kind, name in self._made:
            if kind == "netns" and (NETNS_DIR / name).exists():
                pids = Host(0, name, "", "").pids()
                for pid in pids:
                    problems.append(f"process {pid} still running in {name}: killed")
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        for kind, name in reversed(self._made):
            if kind == "netns":
                out = ip("netns", "del", name, check=False)
            elif kind == "forward":
                out = _forward("-D", name)
            else:
                out = ip("link", "del", name, check=False)
            if out.returncode != 0 and "Cannot find" not in out.stderr and "Bad rule" not in out.stderr and "No such" not in out.stderr \
                    and "does not exist" not in out.stderr:
                problems.append(f"removing {kind} {name}: {out.stderr.strip()}")
        self._made.clear()
        self.hosts.clear()
        return problems

    def __enter__(self) -> HostNetwork:
        return self.create()

    def __exit__(self, *exc) -> None:
        self.destroy()
