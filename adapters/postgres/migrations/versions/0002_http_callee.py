"""The HTTP callee's stored requests and tombstones.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
CREATE TABLE eo_http_request (
  endpoint text NOT NULL,
  request_id uuid NOT NULL,
  type text NOT NULL,
  body bytea NOT NULL,
  headers jsonb NOT NULL DEFAULT '{}'::jsonb,
  answered boolean NOT NULL DEFAULT false,
  stored_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (endpoint, request_id)
)""")
    op.execute("""
CREATE TABLE eo_http_tombstone (
  endpoint text NOT NULL,
  request_id uuid NOT NULL,
  deleted_at timestamptz NOT NULL,
  PRIMARY KEY (endpoint, request_id)
)""")


def downgrade() -> None:
    op.execute("DROP TABLE eo_http_tombstone")
    op.execute("DROP TABLE eo_http_request")
