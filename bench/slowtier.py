"""A slow tier that is slow: a file system on a loop device whose reads and writes are
throttled to N MB/s and M IOPS by the cgroup v1 blkio controller.  For benchmarks of
tiering (root needed); it models a hard disk (the HyCache paper's did 195 IOPS), or a share
of a parallel file system.

* The device: a sparse image file (``size``) attached to a loop device with
  ``--direct-io=on`` (so its blocks are not cached a second time in the host's page cache
  of the image), an ext4 file system made and mounted before the throttle is set (its
  inode tables and journal are initialised up front, so no lazy-init thread writes to the
  device during a run).
* The throttle: ``blkio.throttle.read_bps_device`` and ``write_bps_device`` (bytes per
  second), ``read_iops_device`` and ``write_iops_device`` (requests per second, 200 by
  default; 0: no IOPS limit) for the loop device's ``MAJ:MIN`` in the blkio hierarchy's
  root cgroup.  The loop queue's ``max_sectors_kb`` is raised to its hardware limit so a
  large request counts as one I/O, as on a disk, whose sequential transfers pay no seek.
  The loop queue takes at most 128 segments, so an O_DIRECT request from a buffer of
  scattered 4 KiB pages is cut into 512 KiB I/Os: at 200 IOPS a 1 MiB O_DIRECT stream gets
  ~105 MB/s, while buffered I/O (the page cache's large folios) and 4 MiB requests reach
  the bandwidth limit.  A rule names one device, so
  nothing else on the machine is throttled; every process that reads or writes that device
  is, including the kernel's writeback of dirty pages (in cgroup v1 writeback is charged to
  the root cgroup, so a rule on a child cgroup would let buffered writes through).  The
  device is shared by everyone who uses it: two agents with their slow tiers on it share
  its N MB/s, like two nodes reading one parallel file system.
* Shared-store mode: ``share(name)`` is a subdirectory of the one throttled file system,
  one per agent's slow tier: several agents' slow tiers then share one device's limits.
* ``drop_cache()`` writes the file system's dirty pages back (``syncfs``, at the
  throttled rate) and drops its files' clean pages from the page cache
  (``POSIX_FADV_DONTNEED`` file by file): the next read of a file really reaches the
  device.  Scoped to this file system; other processes' caches are left alone.
* ``read_bytes()`` / ``write_bytes()``: the bytes the device served (``/sys/block/loopN/stat``),
  what a run really read from the slow tier whatever path the read took (with FUSE
  passthrough a local file's reads bypass the agent's counters).

Everything is undone on ``close()`` (the context manager's exit, also on Ctrl-C): the
rules cleared, the file system unmounted (lazily if still busy), the loop device detached,
the image removed.

    python bench/slowtier.py --mbps 150 --iops 200   # verifies the throttle with dd: O_DIRECT and buffered
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BLKIO = Path("/sys/fs/cgroup/blkio")
SECTOR = 512


def _syncfs(fd: int) -> None:
    """syncfs(2): this file system's dirty pages only (Python < 3.12 has no os.syncfs; a
    global sync() would wait for every other throttled device's writeback too)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


class SlowTier:
    def __init__(self, mbps: float, size: str = "4G", base: Path | None = None, iops: int = 200) -> None:
        if os.geteuid() != 0:
            raise SystemExit("slowtier: a throttled slow tier needs root (losetup, mount, blkio)")
        if not (BLKIO / "blkio.throttle.read_bps_device").exists():
            raise SystemExit(f"slowtier: no cgroup v1 blkio throttle at {BLKIO}")
        self.bps = int(mbps * 1_000_000)
        self.iops = int(iops)
        self.dir = Path(tempfile.mkdtemp(prefix="slowtier-", dir=base))
        self.image = self.dir / "image"
        self.mnt = self.dir / "mnt"
        self.loop: str | None = None
        self.majmin: str | None = None
        self._mounted = False
        try:
            self.mnt.mkdir()
            _run("truncate", "-s", size, str(self.image))
            self.loop = _run("losetup", "--find", "--show", "--direct-io=on", str(self.image))
            _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.loop)
            _run("mount", "-o", "noatime", self.loop, str(self.mnt))
            self._mounted = True
            self.majmin = _run("lsblk", "-dno", "MAJ:MIN", self.loop).replace(" ", "")
            queue = Path(f"/sys/block/{Path(self.loop).name}/queue")
            (queue / "max_sectors_kb").write_text((queue / "max_hw_sectors_kb").read_text())
            self._throttle(self.bps, self.iops)
        except BaseException:
            self.close()
            raise

    def _throttle(self, bps: int, iops: int) -> None:
        """Set the rules (a 0 removes one)."""
        for kind in ("read", "write"):
            (BLKIO / f"blkio.throttle.{kind}_bps_device").write_text(f"{self.majmin} {bps}\n")
            (BLKIO / f"blkio.throttle.{kind}_iops_device").write_text(f"{self.majmin} {iops}\n")

    def describe(self) -> str:
        return (f"{self.bps / 1e6:g} MB/s and {self.iops} IOPS per direction (cgroup v1 blkio throttle on "
                f"{self.loop} {self.majmin}, a loop device with --direct-io=on), ext4")

    def rules(self, majmin: str | None = None) -> dict[str, int]:
        """The blkio rules in force for this device (or ``majmin``): file name -> limit."""
        dev = majmin or self.majmin
        found = {}
        for kind in ("read_bps", "write_bps", "read_iops", "write_iops"):
            for line in (BLKIO / f"blkio.throttle.{kind}_device").read_text().splitlines():
                if line.split()[0] == dev:
                    found[kind] = int(line.split()[1])
        return found

    def share(self, name: str) -> Path:
        """A subdirectory of the throttled file system for one user of the shared store (an
        agent's slow tier): every share draws on the one device's limits."""
        d = self.mnt / name
        d.mkdir(exist_ok=True)
        return d

    def __enter__(self) -> SlowTier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _stat(self) -> list[int]:
        return [int(x) for x in Path(f"/sys/block/{Path(self.loop).name}/stat").read_text().split()]

    def read_bytes(self) -> int:
        return self._stat()[2] * SECTOR

    def write_bytes(self) -> int:
        return self._stat()[6] * SECTOR

    def drop_cache(self) -> None:
        fd = os.open(self.mnt, os.O_RDONLY)
        try:
            _syncfs(fd)
        finally:
            os.close(fd)
        for root, _dirs, files in os.walk(self.mnt):
            for name in files:
                try:
                    f = os.open(os.path.join(root, name), os.O_RDONLY | os.O_NOFOLLOW)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(f, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(f)

    def close(self) -> None:
        if self.majmin:
            try:
                self._throttle(0, 0)  # 0 removes a rule
            except OSError as e:
                print(f"slowtier: could not clear the blkio rule for {self.majmin}: {e}", file=sys.stderr)
            self.majmin = None
        if self._mounted:
            if subprocess.run(["umount", str(self.mnt)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
            self._mounted = False
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], capture_output=True)
            self.loop = None
        self.image.unlink(missing_ok=True)
        try:
            self.mnt.rmdir()
            self.dir.rmdir()
        except OSError:
            pass


def _dd(args: list[str]) -> float:
    """dd's own rate line, in MB/s."""
    out = subprocess.run(["dd", *args], capture_output=True, text=True, check=True).stderr.strip().splitlines()[-1]
    t = float(out.split(" copied, ")[1].split(" s")[0])
    return int(out.split(" bytes")[0]) / t / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mbps", type=float, default=150.0, help="the throttle, MB/s (default 150)")
    ap.add_argument("--iops", type=int, default=200, help="the IOPS limit (default 200; 0: none)")
    ap.add_argument("--mib", type=int, default=200, help="the test file, MiB (default 200)")
    args = ap.parse_args()
    with SlowTier(args.mbps, size="1G", iops=args.iops) as st:
        f = st.mnt / "dd-test"
        print(f"device {st.loop} ({st.majmin}) at {st.mnt}, throttled to {args.mbps:g} MB/s, {args.iops} IOPS")
        t0 = time.monotonic()
        w = _dd(["if=/dev/zero", f"of={f}", "bs=1M", f"count={args.mib}", "oflag=direct"])
        print(f"write O_DIRECT      {w:8.1f} MB/s")
        r0 = st.read_bytes()
        st.drop_cache()
        print(f"read buffered       {_dd([f'if={f}', 'of=/dev/null', 'bs=1M']):8.1f} MB/s  "
              f"(device served {(st.read_bytes() - r0) / 1e6:.0f} MB)")
        print(f"read O_DIRECT       {_dd([f'if={f}', 'of=/dev/null', 'bs=1M', 'iflag=direct']):8.1f} MB/s")
        print(f"read cached         {_dd([f'if={f}', 'of=/dev/null', 'bs=1M']):8.1f} MB/s  (page cache, not dropped)")
        f.unlink()
        print(f"({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
