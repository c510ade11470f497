"""One dead-letter entry per message, whatever its message ID or body; what PostgreSQL cannot
hold kept escaped, with its bytes.

- `eo_dead_letter.originals` (jsonb, field -> base64): the bytes of each text of the message
  that had to be kept escaped (bytes that were not UTF-8, U+0000 in its type, message ID,
  producer or headers: `application.wire_text`); `{}` for the others.
- Every dead letter with a message ID now has a digest (a clipped body's is taken over the
  type and the whole body's SHA-256, which the copy carries), so copies of one malformed
  message are one entry, as copies of a replayable one were: the unique index of 0011
  (`endpoint, producer, message_id, digest`) covers those with a UUID message ID, and
  `eo_dead_letter_raw_message` those whose message ID is not one (`raw_message_id`).

Both are additions: a worker of the revisions before (which writes no `originals` and no
digest for such messages) runs unchanged on this schema during a rolling upgrade.

Revision ID: 0013
Revises: 0012
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE eo_dead_letter "
               "ADD COLUMN originals jsonb NOT NULL DEFAULT '{}'::jsonb")
    op.execute("CREATE UNIQUE INDEX eo_dead_letter_raw_message ON eo_dead_letter "
               "(endpoint, producer, raw_message_id, digest) "
               "WHERE message_id IS NULL AND raw_message_id IS NOT NULL "
               "AND digest IS NOT NULL")


def downgrade() -> None:
    op.execute("DROP INDEX eo_dead_letter_raw_message")
    op.execute("ALTER TABLE eo_dead_letter DROP COLUMN originals")
