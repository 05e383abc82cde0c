"""Mount points and the kernel's caches: is something mounted, unmount whatever state its
daemon is in, drop the page cache between benchmark rounds."""

from __future__ import annotations

import os
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
    """Lazy-unmount a FUSE mount whatever state its daemon is in (a killed one's too)."""
    # Ask the mount table, not stat(): a dead FUSE mount answers stat() with ENOTCONN,
    # which os.path.ismount() reports as "not a mount point".
    if in_mount_table(mountpoint):
        subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True)
    if in_mount_table(mountpoint):
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def drop_caches(level: int = 3) -> None:
    """``sync``, then write ``level`` to /proc/sys/vm/drop_caches (1: the page cache; 3:
    dentries and inodes too). Needs root: raises OSError otherwise."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write(f"{level}\n")
