"""Slurm jobs HyCache places and stages (issue 35)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""
import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'slurm_jobs',
        sa.Column('id', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('manifest_id', sa.Integer(), nullable=True),
        sa.Column('job', sa.String(length=200), nullable=True),
        sa.Column('inputs', sa.JSON(), nullable=False),
        sa.Column('outputs', sa.JSON(), nullable=False),
        sa.Column('staged_on', sa.String(length=200), nullable=True),
        sa.Column('ran_on', sa.String(length=200), nullable=True),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('stage_action_id', sa.Integer(), nullable=True),
        sa.Column('pin_action_id', sa.Integer(), nullable=True),
        sa.Column('hooks', sa.JSON(), nullable=False),
        sa.Column('published', sa.JSON(), nullable=True),
        sa.Column('exit_code', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.Column('updated_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_slurm_jobs_manifest_id', 'slurm_jobs', ['manifest_id'])


def downgrade() -> None:
    op.drop_index('ix_slurm_jobs_manifest_id', table_name='slurm_jobs')
    op.drop_table('slurm_jobs')
