"""A committed transaction's outgoing messages whose co-located tokens stand for their
side-effect records: their IDs and positions on the transaction record.

On the co-located fast path (protocol 3.2) the commit inserts each outgoing message's token,
a row that holds the message (destination, type, body, headers). The side-effect record it
also wrote held the same message a second time, and was deleted by the clear: two row writes
and two index entries per message, for a row read only when a crash left the transaction
committed. From this revision the commit writes the messages' IDs and positions (`seq`) on
the transaction record instead (two array columns, no index: the update stays heap-only),
`finish` reads the records back from the tokens that are still there (a consumed token was
delivered), and the clear empties the columns. Measured on the bench (docs/bench.md).

Workers older than this revision do not read the columns: one of them finishing a
transaction that a newer worker committed and crashed on would clear it without publishing
its messages. Revision 0008 refuses such a clear (docs/operations.md).

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE eo_transaction_record ADD COLUMN in_token_ids uuid[], "
               "ADD COLUMN in_token_seqs int[]")


def downgrade() -> None:
    # the records that tokens stand for in unfinished transactions become rows again, so
    # the older code finishes them (their tokens still there: the others were delivered)
    op.execute("""
        INSERT INTO eo_side_effect_record
          (endpoint, partition_key, kind, key, incoming_id, attempt_id, seq, payload,
           registered_at)
        SELECT t.endpoint, t.partition_key, 'message', k.message_id::text, t.message_id,
               t.attempt_id, o.seq,
               jsonb_build_object('destination', k.endpoint, 'type', k.type,
                                  'body', convert_from(k.body, 'UTF8'),
                                  'headers', k.headers::text),
               t.committed_at
          FROM eo_transaction_record t,
               unnest(t.in_token_ids, t.in_token_seqs) AS o(message_id, seq)
          JOIN eo_token k ON k.message_id = o.message_id
         WHERE t.message_id IS NOT NULL
        ON CONFLICT DO NOTHING""")
    op.execute("ALTER TABLE eo_transaction_record DROP COLUMN in_token_seqs, "
               "DROP COLUMN in_token_ids")
