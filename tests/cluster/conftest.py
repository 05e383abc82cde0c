"""Fixtures of the multi-agent tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def secret_file(tmp_path) -> Path:
    p = tmp_path / "cluster.secret"
    p.write_text(os.urandom(32).hex())
    p.chmod(0o600)
    return p
