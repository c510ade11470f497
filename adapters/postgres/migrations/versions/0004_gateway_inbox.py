"""The gateway's inbox: outside producers' commands under their natural message IDs, kept
after relaying (`relayed_at`) for the retention window so a re-run producer adds nothing.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
CREATE TABLE eo_inbox (
  endpoint text NOT NULL,
  message_id uuid NOT NULL,
  type text NOT NULL,
  body bytea NOT NULL,
  received_at timestamptz NOT NULL DEFAULT now(),
  relayed_at timestamptz,
  PRIMARY KEY (endpoint, message_id)
)""")
    # the relay's scan: only the rows still to publish, oldest first
    op.execute("CREATE INDEX eo_inbox_pending ON eo_inbox (endpoint, received_at) "
               "WHERE relayed_at IS NULL")
    # the retention purge's scan
    op.execute("CREATE INDEX eo_inbox_relayed ON eo_inbox (endpoint, relayed_at) "
               "WHERE relayed_at IS NOT NULL")


def downgrade() -> None:
    op.execute("DROP TABLE eo_inbox")
