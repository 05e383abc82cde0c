"""bench/fuse_requests.py's pure parts: the trace text of the kernel's fuse trace points
turned into latencies by opcode, and the per-operation summary. No timings are asserted:
the benchmark itself prints numbers."""

from __future__ import annotations

# bench/ is on pytest's pythonpath (pyproject.toml)
import fuse_requests as fr
import pytest

TRACE = """\
# tracer: nop
#
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
          python-91      [001] .....   100.000100: fuse_request_send: connection 57 req 2 opcode 3 (FUSE_GETATTR) len 56
          python-91      [001] .....   100.000150: fuse_request_send: connection 57 req 4 opcode 1 (FUSE_LOOKUP) len 49
    hycache-agent-80     [000] .....   100.000300: fuse_request_end: connection 57 req 2 len 120 error 0
    hycache-agent-80     [000] .....   100.001150: fuse_request_end: connection 57 req 4 len 144 error -2
    hycache-agent-80     [000] .....   100.001200: fuse_request_end: connection 57 req 9 len 16 error 0
          python-91      [001] .....   100.002000: fuse_request_send: connection 57 req 6 opcode 25 (FUSE_FLUSH) len 64
          python-91      [001] .....   100.002000: fuse_request_send: connection 57 req 8 opcode 99 (FUSE_NEW) len 64
    hycache-agent-80     [000] .....   100.004000: fuse_request_end: connection 57 req 8 len 16 error 0
"""


def test_parse_trace_pairs_send_and_end_by_request() -> None:
    lat = fr.parse_trace(TRACE)
    assert lat["GETATTR"] == [pytest.approx(0.2)]
    assert lat["LOOKUP"] == [pytest.approx(1.0)]  # an error reply ends a request too
    assert lat["99"] == [pytest.approx(2.0)]  # an opcode without a name keeps its number
    # req 9 was sent before the trace began, req 6 not answered when it stopped
    assert "FLUSH" not in lat and sum(len(v) for v in lat.values()) == 3


def test_summary_counts_requests_per_operation_and_their_share() -> None:
    s = fr.summary({"FLUSH": [3.0, 1.0], "LOOKUP": [0.5, 0.5]}, ops=2)
    assert list(s) == ["FLUSH", "LOOKUP"]  # largest share of the request time first
    assert s["FLUSH"]["per_op"] == 1.0 and s["FLUSH"]["mean_ms"] == 2.0
    assert s["FLUSH"]["p50_ms"] == 3.0 and s["FLUSH"]["share"] == pytest.approx(0.8)
    assert s["LOOKUP"]["share"] == pytest.approx(0.2)


def test_counts_delta_is_what_a_phase_added_and_the_watermark_after() -> None:
    before = {"commits": 10, "pool_misses": 3, "pool_refills": 5, "pool_low": 64}
    after = {"commits": 40, "pool_misses": 3, "pool_refills": 9, "pool_low": 256}
    assert fr.counts_delta(before, after) == {"commits": 30, "pool_misses": 0, "pool_refills": 4, "pool_low": 256}
    # an agent without the pool's counters (an older build as base-*): left as None
    old = {"commits": 7, "pool_misses": None, "pool_refills": None, "pool_low": None}
    assert fr.counts_delta(old, {**old, "commits": 9}) == {"commits": 2, "pool_misses": None,
                                                            "pool_refills": None, "pool_low": None}
    assert fr.counts_delta(None, after) is None  # not an agent (mergerfs, raw)
