"""Pure helpers of the peer data service: secret file, Range parsing, addresses."""

from __future__ import annotations

import os

import pytest
from hycache_agent.transport.auth import SecretFileError, load_secret
from hycache_agent.transport.wire import RangeError, parse_addr, parse_range


def test_parse_range_unit():
    assert parse_range("bytes=0-0", 1) == (0, 0)
    assert parse_range("bytes=5-100", 10) == (5, 9)
    assert parse_range("bytes=-100", 10) == (0, 9)
    for bad, status in [("bytes=0-", 0), ("bytes=-0", 5), ("bytes=10-", 10)]:
        with pytest.raises(RangeError) as e:
            parse_range(bad, status)
        assert e.value.status == 416
    for bad in ["items=0-1", "bytes=a-b", "bytes=-", "bytes 0-1", "bytes=1-2,3-4"]:
        with pytest.raises(RangeError) as e:
            parse_range(bad, 100)
        assert e.value.status == 400

def test_load_secret(tmp_path):
    p = tmp_path / "secret"
    p.write_bytes(b"  0123456789abcdef0123456789abcdef\n")
    os.chmod(p, 0o644)
    with pytest.raises(SecretFileError, match="accessible by other users.*0644.*chmod"):
        load_secret(p)
    os.chmod(p, 0o604)
    with pytest.raises(SecretFileError, match="other users"):
        load_secret(p)
    os.chmod(p, 0o600)
    assert load_secret(p) == b"0123456789abcdef0123456789abcdef"
    os.chmod(p, 0o640)
    assert load_secret(str(p)) == b"0123456789abcdef0123456789abcdef"
    p.write_bytes(b"short\n")
    with pytest.raises(SecretFileError, match="at least 16"):
        load_secret(p)
    with pytest.raises(SecretFileError, match="No such file"):
        load_secret(tmp_path / "nope")
    with pytest.raises(SecretFileError, match="not a regular file"):
        load_secret(tmp_path)

def test_parse_addr():
    assert parse_addr("127.0.0.1:7070") == ("127.0.0.1", 7070)
    assert parse_addr("[::1]:80") == ("::1", 80)
    assert parse_addr(":9") == ("0.0.0.0", 9)
    assert parse_addr(("h", "5")) == ("h", 5)
    for bad in ("host", "host:x", "h:70000"):
        with pytest.raises(ValueError):
            parse_addr(bad)
