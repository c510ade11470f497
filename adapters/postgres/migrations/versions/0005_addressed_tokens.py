"""Tokens name the endpoint they are addressed to (only it may consume them), and
processed-message rows keep the processed body's SHA-256 (a known message ID with another
body is not a copy).

Tokens written before this revision get the destination their side-effect record names when
it still exists (a transaction not finished yet); the others (messages already dispatched)
keep a NULL address, which any endpoint of the token path may consume until they drain.

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE eo_token ADD COLUMN endpoint text")
    op.execute("""
UPDATE eo_token t SET endpoint = r.payload->>'destination'
  FROM eo_side_effect_record r
 WHERE r.kind = 'message' AND r.key = t.message_id::text AND t.endpoint IS NULL""")
    # every new token is addressed; the rows above are not checked (NOT VALID)
    op.execute("ALTER TABLE eo_token ADD CONSTRAINT eo_token_addressed "
               "CHECK (endpoint IS NOT NULL) NOT VALID")
    op.execute("ALTER TABLE eo_processed_message ADD COLUMN body_sha256 text")


def downgrade() -> None:
    op.execute("ALTER TABLE eo_processed_message DROP COLUMN body_sha256")
    op.execute("ALTER TABLE eo_token DROP CONSTRAINT eo_token_addressed")
    op.execute("ALTER TABLE eo_token DROP COLUMN endpoint")
