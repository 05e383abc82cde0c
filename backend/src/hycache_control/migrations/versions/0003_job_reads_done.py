"""manifest jobs: when a job finished reading its inputs (the "reads done" event)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""
import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('manifest_jobs') as b:
        b.add_column(sa.Column('reads_done_at', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('manifest_jobs') as b:
        b.drop_column('reads_done_at')
