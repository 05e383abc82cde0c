"""Black-box data integrity through a HyCache mount while files migrate (DESIGN invariant 1:
no byte of closed data is ever lost by tiering).

A 1 MiB fast tier and 8 files of 256 KiB (2x the tier) that are rewritten (open O_TRUNC,
write, close) and read back in turn keep evictions and promotions running; a second thread
creates and removes small files in another directory at the same time, as any real workload
(or pjdfstest) does. Every read must return exactly the bytes last written and closed, and
so must a fresh agent on the same root after a clean unmount.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

FILES, SIZE, ROUNDS = 8, 256 * 1024, 240


def content(i: int, gen: int) -> bytes:
    return (f"{i}:{gen}:".encode() * (SIZE // 4))[:SIZE]


def describe(got: bytes, want: bytes) -> str:
    if len(got) != len(want):
        return f"length {len(got)}, want {len(want)}; starts {got[:12]!r}"
    first = next(k for k in range(len(got)) if got[k] != want[k])
    return f"first difference at byte {first}: {got[first:first + 12]!r}, want {want[first:first + 12]!r}"


class SideLoad(threading.Thread):
    """Create, write, close and unlink small files in another directory until stopped."""

    def __init__(self, directory):
        super().__init__(daemon=True, name="side-load")
        self.dir, self.stop_event, self.ops, self.errors = directory, threading.Event(), 0, []

    def run(self):
        self.dir.mkdir()
        try:
            while not self.stop_event.is_set():
                p = self.dir / f"s{self.ops % 16}"
                p.write_bytes(b"x" * 100)
                p.unlink()
                self.ops += 1
        except OSError as e:
            self.errors.append(repr(e))


@pytest.mark.mount
@pytest.mark.parametrize("kernel_cache", [True, False], ids=["kernel-cache", "no-kernel-cache"])
def test_rewrites_survive_constant_migration(hycache_mount, kernel_cache):
    m = hycache_mount(fast_capacity="1M", no_kernel_cache=not kernel_cache)
    d = m.mountpoint / "churn"
    d.mkdir()
    side = SideLoad(m.mountpoint / "side")
    side.start()
    expected: dict[int, bytes] = {}
    problems: list[str] = []
    try:
        for r in range(ROUNDS):
            i = r % FILES
            data = content(i, r)
            try:
                (d / f"c{i}").write_bytes(data)
            except OSError as e:
                problems.append(f"round {r}: writing c{i}: {e!r}")
                break
            expected[i] = data
            j = (i + FILES // 2) % FILES
            if j in expected:
                try:
                    got = (d / f"c{j}").read_bytes()
                except OSError as e:
                    problems.append(f"round {r}: reading c{j}: {e!r}")
                    continue
                if got != expected[j]:
                    problems.append(f"round {r}: c{j} (closed 4 rounds earlier): {describe(got, expected[j])}")
            time.sleep(0.002)
    finally:
        side.stop_event.set()
        side.join(timeout=60)
    assert m.proc.poll() is None, f"agent died:\n{m.stderr[-4000:]}"
    assert not side.errors, f"side load failed: {side.errors}"
    assert not problems, (f"{len(problems)} of {ROUNDS} read-backs wrong under migration "
                          f"(side load did {side.ops} create/unlink pairs; agent log {m.log}):\n"
                          + "\n".join(problems[:15]))

    # Durability across a clean restart: a new agent on the same root sees the same bytes.
    m2 = hycache_mount.remount(m)
    for i, want in expected.items():
        got = (m2.mountpoint / "churn" / f"c{i}").read_bytes()
        assert got == want, f"after remount c{i}: {describe(got, want)}"
    assert sorted(os.listdir(m2.mountpoint / "side")) == []
