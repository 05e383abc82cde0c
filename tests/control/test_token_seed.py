"""The configured admin token is installed once when several control-plane processes
start together on one database (``serve --workers N``): the one that loses the race
between its check and its insert finds the token there and starts, instead of failing
its start-up with a unique violation (seen on PostgreSQL in the ansible rollout)."""

from __future__ import annotations

from hycache_control.db import Database
from hycache_control.services.tokens import TokenService, hash_secret

SECRET = "hct_configured-admin-for-the-seed-test"


class _LosesTheRace(TokenService):
    """A process whose insert comes right after a sibling's (same database)."""

    def __init__(self, db: Database, sibling: TokenService) -> None:
        super().__init__(db)
        self.sibling = sibling

    def create(self, name, scope, node_id=None, secret=None):
        assert self.sibling.ensure(secret, name)  # the sibling installs it first
        return super().create(name, scope, node_id, secret)


def test_the_process_that_loses_the_race_starts_and_the_token_is_there_once(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'control.db'}")
    try:
        db.upgrade()
        loser = _LosesTheRace(db, TokenService(db))
        assert loser.ensure(SECRET, "configured-admin") is False  # no error: it is there
        rows, total = loser.list()
        assert total == 1 and rows[0].hash == hash_secret(SECRET) and rows[0].scope == "admin"
        assert loser.ensure(SECRET, "configured-admin") is False  # and a restart adds nothing
    finally:
        db.close()
