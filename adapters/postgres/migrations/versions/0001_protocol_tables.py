"""The protocol's tables: tokens, transaction records with state, side-effect records,
deferred clean-ups, inbox rows, stored replies.

Revision ID: 0001
Revises:
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_UP = """
CREATE TABLE eo_token (
  message_id uuid PRIMARY KEY,
  type text NOT NULL,
  body bytea NOT NULL,
  headers jsonb NOT NULL DEFAULT '{}'::jsonb,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE eo_transaction_record (
  endpoint text NOT NULL,
  partition_key text NOT NULL,
  message_id uuid,
  attempt_id uuid,
  version bigint NOT NULL DEFAULT 0,
  committed_at timestamptz,
  state jsonb,
  PRIMARY KEY (endpoint, partition_key),
  CHECK ((message_id IS NULL) = (attempt_id IS NULL))
);
CREATE INDEX eo_transaction_record_committed ON eo_transaction_record (endpoint, committed_at)
  WHERE message_id IS NOT NULL;
CREATE TABLE eo_side_effect_record (
  endpoint text NOT NULL,
  partition_key text NOT NULL,
  kind text NOT NULL,
  key text NOT NULL,
  incoming_id uuid NOT NULL,
  attempt_id uuid NOT NULL,
  seq integer NOT NULL,
  payload jsonb NOT NULL DEFAULT '{}'::jsonb,
  registered_at timestamptz NOT NULL,
  PRIMARY KEY (endpoint, kind, key)
);
CREATE INDEX eo_side_effect_record_partition ON eo_side_effect_record (endpoint, partition_key);
CREATE TABLE eo_deferred_cleanup (
  cleanup_id bigserial PRIMARY KEY,
  endpoint text NOT NULL,
  kind text NOT NULL,
  key text NOT NULL,
  payload jsonb NOT NULL DEFAULT '{}'::jsonb,
  due timestamptz NOT NULL
);
CREATE INDEX eo_deferred_cleanup_due ON eo_deferred_cleanup (endpoint, due);
CREATE TABLE eo_processed_message (
  endpoint text NOT NULL,
  message_id uuid NOT NULL,
  partition_key text NOT NULL,
  outgoing jsonb NOT NULL,
  processed_at timestamptz NOT NULL,
  PRIMARY KEY (endpoint, message_id)
);
CREATE INDEX eo_processed_message_age ON eo_processed_message (endpoint, processed_at);
CREATE TABLE eo_stored_reply (
  endpoint text NOT NULL,
  message_id uuid NOT NULL,
  status integer NOT NULL,
  body jsonb NOT NULL,
  PRIMARY KEY (endpoint, message_id)
);
"""

_DOWN = """
DROP TABLE eo_stored_reply; DROP TABLE eo_processed_message; DROP TABLE eo_deferred_cleanup;
DROP TABLE eo_side_effect_record; DROP TABLE eo_transaction_record; DROP TABLE eo_token;
"""


def upgrade() -> None:
    for statement in filter(str.strip, _UP.split(";")):
        op.execute(statement)


def downgrade() -> None:
    for statement in filter(str.strip, _DOWN.split(";")):
        op.execute(statement)
