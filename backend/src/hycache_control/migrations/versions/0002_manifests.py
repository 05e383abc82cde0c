"""manifests, their jobs, and plan steps as action items

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""
import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

ITEM_COLUMNS = (
    ("kind", sa.String(length=16)), ("job", sa.String(length=200)), ("step", sa.Integer()),
    ("plan_action", sa.String(length=16)), ("size", sa.BigInteger()), ("source", sa.String(length=200)),
)


def upgrade() -> None:
    op.create_table('manifests',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=True),
    sa.Column('format', sa.String(length=32), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('actor', sa.String(length=200), nullable=True),
    sa.Column('document', sa.JSON(), nullable=False),
    sa.Column('options', sa.JSON(), nullable=False),
    sa.Column('result', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('manifest_jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('manifest_id', sa.Integer(), nullable=False),
    sa.Column('job', sa.String(length=200), nullable=False),
    sa.Column('node', sa.String(length=200), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('parents', sa.JSON(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=True),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['manifest_id'], ['manifests.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_manifest_jobs_manifest_id', 'manifest_jobs', ['manifest_id'], unique=False)
    op.create_index('ix_manifest_jobs_manifest_job', 'manifest_jobs', ['manifest_id', 'job'], unique=True)
    with op.batch_alter_table('actions') as b:
        b.add_column(sa.Column('manifest_id', sa.Integer(), nullable=True))
        b.create_index('ix_actions_manifest_id', ['manifest_id'], unique=False)
        b.create_foreign_key('fk_actions_manifest_id', 'manifests', ['manifest_id'], ['id'], ondelete='CASCADE')
    with op.batch_alter_table('action_items') as b:
        for name, type_ in ITEM_COLUMNS:
            b.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('action_items') as b:
        for name, _ in reversed(ITEM_COLUMNS):
            b.drop_column(name)
    op.execute("DELETE FROM action_items WHERE action_id IN (SELECT id FROM actions WHERE manifest_id IS NOT NULL)")
    op.execute("DELETE FROM actions WHERE manifest_id IS NOT NULL")
    with op.batch_alter_table('actions') as b:
        b.drop_constraint('fk_actions_manifest_id', type_='foreignkey')
        b.drop_index('ix_actions_manifest_id')
        b.drop_column('manifest_id')
    op.drop_index('ix_manifest_jobs_manifest_job', table_name='manifest_jobs')
    op.drop_index('ix_manifest_jobs_manifest_id', table_name='manifest_jobs')
    op.drop_table('manifest_jobs')
    op.drop_table('manifests')
