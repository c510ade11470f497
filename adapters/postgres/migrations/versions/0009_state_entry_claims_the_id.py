"""A state-stream entry claims its message ID for the endpoint, whatever the partition.

Until this revision an entry was unique per (endpoint, partition, message ID) only, so one
message ID under two bodies that map to two partitions was appended on both: a message
committed twice (I1; issue 24 found the same hole in the outbox's processed-message claim).
The unique index below makes the second append fail; the adapter reports it as the ID reused
with another body, and the delivery is dead-lettered.

An endpoint whose stream already holds one ID on two partitions cannot take the index: the
upgrade fails naming the duplicated key (`could not create unique index ... Key (endpoint,
message_id)=(...) is duplicated`). Those entries are the evidence of a double commit: decide
which partition keeps the message (docs/operations.md#migrations), delete the other entry,
and upgrade again.

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE UNIQUE INDEX eo_state_entry_message ON eo_state_entry "
               "(endpoint, message_id)")


def downgrade() -> None:
    op.execute("DROP INDEX eo_state_entry_message")
