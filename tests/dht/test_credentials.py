"""Redis ACL credentials: ``check_credentials`` against a real redis-server whose default
user is off (as deploy/redis/redis-start.sh and the ansible role make it)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest
import redis
from hycache_dht.cluster_client import check_credentials
from hycache_dht.localcluster import find_free_base
from hycache_dht.meta import DHTAuthError, DHTUnavailable

PASSWORD = "agent-password-0123456789"


@pytest.fixture
def acl_redis(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed (scripts/bootstrap.sh installs it)")
    port = find_free_base(1)
    (tmp_path / "acl.conf").write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\nsave \"\"\n"
        "user default off resetpass ~* &* +@all\n"  # as deployed: off, but with the permissions AOF replays need
        f"user hycache-agent on >{PASSWORD} resetkeys ~hc:* -@all +@read +@write +@connection\n")
    proc = subprocess.Popen(["redis-server", str(tmp_path / "acl.conf")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                redis.Redis(port=port, username="hycache-agent", password=PASSWORD).ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_right_password_is_accepted(acl_redis):
    assert check_credentials([("127.0.0.1", acl_redis)], "hycache-agent", PASSWORD) is True


@pytest.mark.parametrize("user, password", [("hycache-agent", "wrong-password-000000"), ("nobody", PASSWORD),
                                            (None, None)])
def test_a_refusal_is_an_auth_error_that_names_the_user_and_the_flags(acl_redis, user, password):
    with pytest.raises(DHTAuthError) as e:
        check_credentials([("127.0.0.1", acl_redis)], user, password)
    assert isinstance(e.value, DHTUnavailable)
    msg = str(e.value)
    assert (f"user {user!r}" if user else "the default user") in msg
    assert "--redis-user" in msg and "--redis-password-file" in msg
    assert password is None or password not in msg


def test_no_node_answering_is_not_an_error(acl_redis):
    # the first node is down, the second refuses: the refusal counts
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        down = s.getsockname()[1]
    assert check_credentials([("127.0.0.1", down)], "hycache-agent", "x" * 20, timeout=0.5) is False
    with pytest.raises(DHTAuthError):
        check_credentials([("127.0.0.1", down), ("127.0.0.1", acl_redis)], "hycache-agent", "x" * 20, timeout=0.5)
