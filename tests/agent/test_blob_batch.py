"""pyfuse3.passthrough_create_batch (the patched pyfuse3), the blob pool's refill with
passthrough: blobs made and registered in one call without the GIL.

Outside a FUSE session the registration itself fails (no /dev/fuse descriptor): each blob
made comes back with descriptor -1 and the negated errno, which is also how a kernel's
refusal comes back; tests/agent/test_mount.py's
test_every_ready_pool_blob_is_registered_ahead_of_its_create covers the registered case
on a real mount."""

from __future__ import annotations

import os
import stat

import pyfuse3
import pytest
from hycache_agent.fs.passthrough import Backings


def test_the_batch_makes_each_blob_empty_and_stops_at_the_first_it_cannot_make(tmp_path):
    (tmp_path / "c").write_bytes(b"kept")
    out = pyfuse3.passthrough_create_batch([os.fsencode(tmp_path / n) for n in "abcd"], 0o600)
    assert len(out) == 2  # a and b made; c exists (O_EXCL): the batch stops there
    for fd, bid, _size, _mtime, _dev, _ino in out:
        assert fd == -1 and bid < 0  # no session: the registration refused, the descriptor closed
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c"]
    for n in "ab":
        st = os.stat(tmp_path / n)
        assert st.st_size == 0 and stat.S_IMODE(st.st_mode) == 0o600
    assert (tmp_path / "c").read_bytes() == b"kept"  # never truncated


def test_the_first_blob_failing_raises_its_error_naming_it(tmp_path):
    (tmp_path / "a").write_bytes(b"")
    with pytest.raises(FileExistsError) as exc:
        pyfuse3.passthrough_create_batch([os.fsencode(tmp_path / "a"), os.fsencode(tmp_path / "b")])
    assert exc.value.filename == str(tmp_path / "a")
    assert not (tmp_path / "b").exists()
    with pytest.raises(FileNotFoundError):
        pyfuse3.passthrough_create_batch([os.fsencode(tmp_path / "no-such-dir" / "x")])
    assert pyfuse3.passthrough_create_batch([]) == []


def test_backings_create_batch_gives_none_for_a_refused_registration(tmp_path):
    out = Backings.create_batch([str(tmp_path / "x"), str(tmp_path / "y")])
    assert out == [None, None]  # made, registration refused (no session): unregistered blobs
    assert sorted(os.listdir(tmp_path)) == ["x", "y"]
    assert Backings.prepare(str(tmp_path / "z"), create=True) is None and (tmp_path / "z").exists()
    with pytest.raises(FileExistsError):
        Backings.prepare(str(tmp_path / "z"), create=True)
