"""initial schema: tokens, nodes, policies, actions, events, metric samples

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""
import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    _actions()
    _events()
    _metric_samples()
    _nodes()
    _policies()
    _tokens()
    _action_items()


def _actions() -> None:
    op.create_table('actions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('action', sa.String(length=16), nullable=False),
    sa.Column('actor', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )


def _events() -> None:
    op.create_table('events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('node', sa.String(length=200), nullable=True),
    sa.Column('actor', sa.String(length=200), nullable=True),
    sa.Column('action', sa.String(length=200), nullable=False),
    sa.Column('result', sa.String(length=200), nullable=False),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_events_ts'), ['ts'], unique=False)


def _metric_samples() -> None:
    op.create_table('metric_samples',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('node_id', sa.String(length=200), nullable=False),
    sa.Column('resolution', sa.Integer(), nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.Column('fast_read_bps', sa.Float(), nullable=False),
    sa.Column('fast_write_bps', sa.Float(), nullable=False),
    sa.Column('slow_read_bps', sa.Float(), nullable=False),
    sa.Column('slow_write_bps', sa.Float(), nullable=False),
    sa.Column('remote_read_bps', sa.Float(), nullable=False),
    sa.Column('hits', sa.Float(), nullable=False),
    sa.Column('misses', sa.Float(), nullable=False),
    sa.Column('hit_ratio', sa.Float(), nullable=True),
    sa.Column('metadata_ops_per_s', sa.Float(), nullable=False),
    sa.Column('remote_fetches_per_s', sa.Float(), nullable=False),
    sa.Column('migrations_per_s', sa.Float(), nullable=False),
    sa.Column('migration_bps', sa.Float(), nullable=False),
    sa.Column('migrations_in_flight', sa.Float(), nullable=False),
    sa.Column('dht_backlog', sa.Float(), nullable=False),
    sa.Column('fast_used', sa.Float(), nullable=False),
    sa.Column('slow_used', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('metric_samples', schema=None) as batch_op:
        batch_op.create_index('ix_metric_samples_node_res_ts', ['node_id', 'resolution', 'ts'], unique=False)


def _nodes() -> None:
    op.create_table('nodes',
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('address', sa.String(length=300), nullable=True),
    sa.Column('version', sa.String(length=64), nullable=True),
    sa.Column('boot_id', sa.String(length=64), nullable=True),
    sa.Column('seq', sa.BigInteger(), nullable=False),
    sa.Column('sent_at', sa.Float(), nullable=True),
    sa.Column('first_seen', sa.Float(), nullable=False),
    sa.Column('last_heartbeat', sa.Float(), nullable=True),
    sa.Column('heartbeats', sa.BigInteger(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('state_since', sa.Float(), nullable=False),
    sa.Column('status', sa.JSON(), nullable=True),
    sa.Column('counters', sa.JSON(), nullable=True),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )


def _policies() -> None:
    op.create_table('policies',
    sa.Column('node_id', sa.String(length=200), nullable=False),
    sa.Column('policy', sa.String(length=64), nullable=False),
    sa.Column('high_watermark', sa.Float(), nullable=False),
    sa.Column('low_watermark', sa.Float(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('applied_version', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('node_id')
    )


def _tokens() -> None:
    op.create_table('tokens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('scope', sa.String(length=16), nullable=False),
    sa.Column('node_id', sa.String(length=200), nullable=True),
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('last_used_at', sa.Float(), nullable=True),
    sa.Column('revoked_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('hash')
    )


def _action_items() -> None:
    op.create_table('action_items',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('action_id', sa.Integer(), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('node', sa.String(length=200), nullable=True),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.Column('tier', sa.String(length=16), nullable=True),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['action_id'], ['actions.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('action_items', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_action_items_action_id'), ['action_id'], unique=False)
        batch_op.create_index('ix_action_items_node_state', ['node', 'state'], unique=False)


def downgrade() -> None:
    # ### commands auto generated by Alembic - please adjust! ###
    with op.batch_alter_table('action_items', schema=None) as batch_op:
        batch_op.drop_index('ix_action_items_node_state')
        batch_op.drop_index(batch_op.f('ix_action_items_action_id'))

    op.drop_table('action_items')
    op.drop_table('tokens')
    op.drop_table('policies')
    op.drop_table('nodes')
    with op.batch_alter_table('metric_samples', schema=None) as batch_op:
        batch_op.drop_index('ix_metric_samples_node_res_ts')

    op.drop_table('metric_samples')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_events_ts'))

    op.drop_table('events')
    op.drop_table('actions')
    # ### end Alembic commands ###
