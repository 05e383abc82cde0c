"""Fixtures for the external POSIX suites (pjdfstest): collects per-target summaries and
prints them at the end of the pytest run (also written to .work/pjdfstest/summary.txt)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_SUMMARIES = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def posix_summaries(request) -> list[str]:
    """Append one human-readable block per suite/target; printed in the terminal summary."""
    return request.config.stash.setdefault(_SUMMARIES, [])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    blocks = config.stash.get(_SUMMARIES, [])
    if not blocks:
        return
    terminalreporter.section("POSIX suites (pjdfstest)")
    for block in blocks:
        terminalreporter.write_line(block)
    out = REPO / ".work" / "pjdfstest"
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.txt").write_text("\n".join(blocks) + "\n")
