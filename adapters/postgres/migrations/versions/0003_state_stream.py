"""The state strategy's event-sourced stream: one entry per processed message and partition.

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
CREATE TABLE eo_state_entry (
  endpoint text NOT NULL,
  partition_key text NOT NULL,
  version bigint NOT NULL CHECK (version > 0),
  message_id uuid NOT NULL,
  state jsonb,
  recorded jsonb NOT NULL DEFAULT '{}'::jsonb,
  appended_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (endpoint, partition_key, version),
  UNIQUE (endpoint, partition_key, message_id)
)""")


def downgrade() -> None:
    op.execute("DROP TABLE eo_state_entry")
