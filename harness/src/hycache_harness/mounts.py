"""Mount points and the kernel's caches: is something mounted, unmount whatever state its
daemon is in, drop the page cache between benchmark rounds."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
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


def fuse_unusable_reason() -> str | None:
    """Why real FUSE mounts cannot run here, or None if they can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (no FUSE in this kernel/container)"
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
    except OSError as e:
        return f"/dev/fuse cannot be opened: {e}"
    os.close(fd)
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (apt package fuse3; run scripts/bootstrap.sh)"
    return None


def shared_tmpdir(prefix: str, parent: str | None = None) -> Path:
    """A new temp dir every user can traverse (mode 0755; a 0700 one would hide a mount in
    it from other users), under ``parent``, else $HYCACHE_TEST_TMP, else the system's."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=parent or os.environ.get("HYCACHE_TEST_TMP")))
    d.chmod(0o755)
    return d
