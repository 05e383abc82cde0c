"""Fixtures of the multi-agent tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from hycache_harness import cluster_secret


@pytest.fixture
def secret_file(tmp_path) -> Path:
    return cluster_secret(tmp_path / "cluster.secret")
