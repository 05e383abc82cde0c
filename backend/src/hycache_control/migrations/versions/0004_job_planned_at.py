"""manifest jobs: when a job's prefetch/evict steps were planned at their release; plan
steps: the job whose output a prefetch waits for

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26
"""
import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('manifest_jobs') as b:
        b.add_column(sa.Column('planned_at', sa.Float(), nullable=True))
    with op.batch_alter_table('action_items') as b:
        b.add_column(sa.Column('after_job', sa.String(length=200), nullable=True))
    # the jobs of manifests submitted before: their steps stay the plan made at submission
    op.execute("UPDATE manifest_jobs SET planned_at = 0")


def downgrade() -> None:
    with op.batch_alter_table('action_items') as b:
        b.drop_column('after_job')
    with op.batch_alter_table('manifest_jobs') as b:
        b.drop_column('planned_at')
