"""Dead letters an operator can act on: `eo_dead_letter`, one row per dead-lettered message
and endpoint, with its reason history and what operators did with it.

Every endpoint's dead letters reach its dead-letter queue (`<endpoint>.dlq`) as before: those
the consumer dead-letters, those its source refuses before processing, and those the broker
dead-letters past the work queue's delivery limit. Each consumer process moves them from the
queue into this table (adapters/rabbitmq/dead_letter_queue.py), where `eo dead-letters` and
its HTTP API list, show, replay and discard them (application/dead_letters.py).

- `message_id`: NULL for a message without a valid one (`raw_message_id` keeps what it
  had); `producer`, `digest` (type and body, `Envelope.digest`): with the endpoint and the
  message ID, the key a message dead-lettered again (after a replay) is found under, so its
  `reasons` (a JSON list of {at, reason, attempt}) keep the whole history;
- `replayable`: false for a message whose body was clipped (malformed, of no known type):
  it can only be discarded;
- `status`: `dead` (waiting for an operator), `replayed` (republished; it comes back as
  `dead` if it fails again), `discarded`; who acted and when, and why for a discard;
- `origin_id`, `origin_producer`: the outside producer's message the chain started from
  (the lineage headers), so an operator finds it by the producer's ID.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
CREATE TABLE eo_dead_letter (
  dead_letter_id bigserial PRIMARY KEY,
  endpoint text NOT NULL,
  message_id uuid,
  raw_message_id text,
  producer text NOT NULL DEFAULT '',
  type text,
  body bytea NOT NULL,
  headers jsonb NOT NULL DEFAULT '{}'::jsonb,
  digest text,
  replayable boolean NOT NULL,
  origin_id text,
  origin_producer text,
  reasons jsonb NOT NULL,
  first_at timestamptz NOT NULL,
  last_at timestamptz NOT NULL,
  status text NOT NULL DEFAULT 'dead' CHECK (status IN ('dead', 'replayed', 'discarded')),
  replays integer NOT NULL DEFAULT 0,
  acted_at timestamptz,
  acted_by text,
  discard_reason text
)""")
    # a message dead-lettered again is found by its key (the collector's upsert)
    op.execute("CREATE UNIQUE INDEX eo_dead_letter_message ON eo_dead_letter "
               "(endpoint, producer, message_id, digest) "
               "WHERE message_id IS NOT NULL AND digest IS NOT NULL")
    # listing by endpoint and status, oldest first; the retention purge by age
    op.execute("CREATE INDEX eo_dead_letter_listing ON eo_dead_letter "
               "(endpoint, status, last_at)")
    op.execute("CREATE INDEX eo_dead_letter_age ON eo_dead_letter (last_at)")


def downgrade() -> None:
    op.execute("DROP TABLE eo_dead_letter")
