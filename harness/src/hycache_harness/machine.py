"""What the machine does under a bench that the bench cannot see in its own numbers."""

from __future__ import annotations

from pathlib import Path

PAGE_REPORTING = Path("/sys/module/page_reporting/parameters")


def free_page_reporting() -> str | None:
    """How a virtual machine gives freed memory back to its host (virtio-balloon's free
    page reporting), or None where it does not.  With it, a freed block of
    ``2^page_reporting_order`` pages that stays free ``min_free_ms`` is handed back, and
    its next use faults on the host: on this project's Firecracker VM (order 9, 0 ms) a
    page cache refilled after ``drop_caches`` or a run of deletes wrote at ~300 MB/s
    instead of ~1.5 GB/s in some turns of a bench and not in others (docs/benchmarks.md,
    session 61)."""
    try:
        order = int((PAGE_REPORTING / "page_reporting_order").read_text())
        min_free = (PAGE_REPORTING / "min_free_ms").read_text().strip()
    except (OSError, ValueError):
        return None
    return f"on: free blocks of {4 << order >> 10} MiB go back to the host after {min_free} ms free"
