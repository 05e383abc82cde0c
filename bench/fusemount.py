"""Stopping FUSE daemons and their mounts (standard library only).

Shared by the test fixtures (``tests/conftest.py``, which loads it by path) and
``bench/fs_bench.py``: both run FUSE daemons (hycache-agent, mergerfs) in the
foreground as child processes and must never leave a mount behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def is_mounted(mountpoint: Path) -> bool:
    try:
        return os.path.ismount(mountpoint)
    except OSError:  # ENOTCONN on a dead FUSE mount still means "mounted"
        return True


def in_mount_table(mountpoint: Path) -> bool:
    target = os.fsencode(os.path.abspath(mountpoint))
    with open("/proc/self/mountinfo", "rb") as f:
        return any(len(fields) > 4 and fields[4].replace(b"\\040", b" ") == target
                   for fields in (line.split(b" ") for line in f))


def force_unmount(mountpoint: Path) -> None:
    """Lazy-unmount a FUSE mount whatever state its daemon is in."""
    # Ask the mount table, not stat(): a dead FUSE mount answers stat() with ENOTCONN,
    # which os.path.ismount() reports as "not a mount point".
    if in_mount_table(mountpoint):
        subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True)
    if in_mount_table(mountpoint):
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def stop_daemon(proc: subprocess.Popen, mountpoint: Path | None, timeout: float) -> int:
    """SIGTERM a running FUSE daemon and wait ``timeout`` s for it to exit; if it does
    not, lazy-unmount ``mountpoint`` (that ends a daemon stuck on its mount), wait 10 s
    more, then SIGKILL. Returns its exit code. The mount may still need ``force_unmount``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            if mountpoint is not None:
                force_unmount(mountpoint)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return proc.returncode
