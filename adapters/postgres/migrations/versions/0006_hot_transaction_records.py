"""Transaction records are updated in place (HOT): no index on the columns a commit or a clear
changes, and free room on every page for the new row version.

Each message updates its partition's transaction record twice (commit, then clear). With the
partial index on `committed_at` (0001) no update could be heap-only: every one added an entry
to the primary key and to that index, and WAL for both. Measured on the bench
(docs/bench.md): PostgreSQL CPU per message on the batched token path 0.152 -> 0.117 ms,
throughput +7 %. The price: the sweeper's query for stale transactions
(`COMMITTED_BEFORE`) scans the endpoint's transaction records, about 70 ms for 1.2 million of
them on the project's 2-core machine, once per sweep interval (docs/operations.md).

`fillfactor` applies to pages written from now on; `VACUUM FULL eo_transaction_record` in a
quiet window rewrites the existing ones (optional: updates free room as they go).

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DROP INDEX IF EXISTS eo_transaction_record_committed")
    op.execute("ALTER TABLE eo_transaction_record SET (fillfactor = 70)")


def downgrade() -> None:
    op.execute("ALTER TABLE eo_transaction_record RESET (fillfactor)")
    op.execute("CREATE INDEX eo_transaction_record_committed ON eo_transaction_record "
               "(endpoint, committed_at) WHERE message_id IS NOT NULL")
