"""Every Alembic revision up and down, on SQLite and PostgreSQL."""

from __future__ import annotations

from hycache_control import db as dbmod
from hycache_control.models import Base
from sqlalchemy import inspect


def test_every_revision_up_and_down(db_url):
    engine = dbmod.make_engine(db_url)
    try:
        revs = dbmod.revisions(engine)
        assert revs and revs[0] == "0001"
        for i, rev in enumerate(revs):
            dbmod.upgrade(engine, rev)
            assert dbmod.current_revision(engine) == rev
            prev = revs[i - 1] if i else "base"
            dbmod.downgrade(engine, prev)
            assert dbmod.current_revision(engine) == (None if prev == "base" else prev)
            dbmod.upgrade(engine, rev)
        # head matches the models: every table and column the code uses exists
        insp = inspect(engine)
        for table in Base.metadata.sorted_tables:
            cols = {c["name"] for c in insp.get_columns(table.name)}
            assert cols == {c.name for c in table.columns}, table.name
        dbmod.downgrade(engine, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()
