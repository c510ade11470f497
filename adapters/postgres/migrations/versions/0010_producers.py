"""Deduplication at the boundary is scoped to the producer, and tells messages apart by type
and body.

- `eo_processed_message.producer`: the authenticated identity of the outside producer whose
  message ID the row claims (RabbitMQ's validated `user_id`, an inbox row's database role;
  '' for an unauthenticated producer). The primary key becomes (endpoint, producer,
  message_id): one producer can no longer squat another's IDs by sending them first.
- `eo_processed_message.digest`: SHA-256 of the message's type and body
  (`Envelope.digest`). `body_sha256` hashed the body only, so a message of another type with
  the same ID and bytes passed for a copy. `body_sha256` stays for workers before this
  revision (the new code writes both) and goes in a later one.
- `eo_inbox.producer`: the database role that inserted the row (`DEFAULT current_user`, so a
  bulk producer cannot name another: a producer role's row-level policy checks it,
  deploy/postgres/roles.sql); its primary key becomes (endpoint, producer, message_id).

Upgrading: the gateways' code before this revision names the old key in its statements
(`ON CONFLICT (endpoint, message_id)`), which no index matches any more, so its commits
and inbox inserts fail (its deliveries would be retried, then dead-lettered). Stop the
gateways' consumers and the bulk producers, migrate, start the new ones; token endpoints
and callees are not concerned and roll as usual (docs/operations.md#migrations).

Revision ID: 0010
Revises: 0009
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE eo_processed_message ADD COLUMN producer text NOT NULL DEFAULT '', "
               "ADD COLUMN digest text")
    op.execute("ALTER TABLE eo_processed_message DROP CONSTRAINT eo_processed_message_pkey, "
               "ADD CONSTRAINT eo_processed_message_pkey "
               "PRIMARY KEY (endpoint, producer, message_id)")
    op.execute("ALTER TABLE eo_inbox ADD COLUMN producer text NOT NULL DEFAULT current_user")
    op.execute("ALTER TABLE eo_inbox DROP CONSTRAINT eo_inbox_pkey, "
               "ADD CONSTRAINT eo_inbox_pkey PRIMARY KEY (endpoint, producer, message_id)")


def downgrade() -> None:
    # a producer's rows under an ID another producer also used cannot share the old key:
    # the older revisions keep one of them (the first processed), as they would have
    op.execute("DELETE FROM eo_processed_message p USING eo_processed_message q "
               "WHERE p.endpoint = q.endpoint AND p.message_id = q.message_id "
               "AND (p.processed_at, p.producer) > (q.processed_at, q.producer)")
    op.execute("ALTER TABLE eo_processed_message DROP CONSTRAINT eo_processed_message_pkey, "
               "ADD CONSTRAINT eo_processed_message_pkey PRIMARY KEY (endpoint, message_id)")
    op.execute("ALTER TABLE eo_processed_message DROP COLUMN producer, DROP COLUMN digest")
    op.execute("DELETE FROM eo_inbox p USING eo_inbox q "
               "WHERE p.endpoint = q.endpoint AND p.message_id = q.message_id "
               "AND (p.received_at, p.producer) > (q.received_at, q.producer)")
    op.execute("ALTER TABLE eo_inbox DROP CONSTRAINT eo_inbox_pkey, "
               "ADD CONSTRAINT eo_inbox_pkey PRIMARY KEY (endpoint, message_id)")
    op.execute("ALTER TABLE eo_inbox DROP COLUMN producer")
