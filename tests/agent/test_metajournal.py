"""The metadata journal's group commits (agent/src/hycache_agent/fs/metastore.py) against a
real SQLite file and its real lane thread."""

from __future__ import annotations

import logging

import trio
from hycache_agent.fs.metastore import MetaJournal, SQLiteStore


def test_a_commit_deferred_behind_one_in_flight_is_made_at_shutdown_without_errors(tmp_path, caplog) -> None:
    """The agent stops while a commit is in flight and another waits for it (a stream of
    operations when SIGTERM came): the stopped lane runs the first one's callback, which
    used to hand the waiting batch to the stopped lane ("journal: callback failed ...
    must be called from async context" in every such agent's log). Both are committed by
    the shutdown's own commit, in order, and nothing is logged as failed."""
    store = SQLiteStore(tmp_path / "meta.db")
    journal = MetaJournal(store, lambda ino: None)

    async def serve_and_stop() -> None:
        journal.counter("first", 1)
        journal.commit_soon()  # handed to the lane: in flight until its callback runs
        journal.counter("second", 2)
        journal.commit_soon()  # deferred: it rides on the next commit
        assert journal._deferred and journal._unapplied, "the second commit waits for the first"
        # the event loop ends here (the agent was signalled) before the first callback ran

    trio.run(serve_and_stop)
    with caplog.at_level(logging.DEBUG, logger="hycache_agent"):
        journal.sync_blocking()
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert failures == []
    counters = SQLiteStore(tmp_path / "meta.db").load().counters
    assert counters.get("first") == 1 and counters.get("second") == 2, counters
    store.close()
