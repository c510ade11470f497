"""Least privilege that holds whatever the roles: token rows cannot be rewritten, and inbox
rows are inserted only by producers, in their own name, for the gateways they are granted.

- A token row holds an in-flight message (claim check). Nothing in the protocol updates one
  (a token is inserted, read, deleted), so a trigger refuses any update of its message
  (`type`, `body`, `headers`) or identity (`message_id`, `endpoint`): a role that can write
  rows could otherwise rewrite a message between its sender's commit and its processing.
- `eo_inbox` gets row-level security (its owner, the migrations' role, is exempt): any role
  with the table's privileges may relay (update) and purge rows, and read them, except a
  producer, which reads its own only; a row is inserted only with `producer = current_user`
  and for an endpoint that `eo_inbox_producer` grants that role. deploy/postgres/roles.sql
  makes a producer role (insert on the inbox only, and a schema of its own for the bulk
  ingest's staging tables) and grants it its gateways. The service's role gets no such
  grant: it cannot insert inbox rows for any endpoint, as it could before.

Revision ID: 0012
Revises: 0011
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE FUNCTION eo_refuse_token_rewrite() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
          RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = 'token ' || OLD.message_id || ' is immutable: a token holds an '
              || 'in-flight message, which nothing may rewrite';
        END $$""")
    op.execute("""
        CREATE TRIGGER eo_token_immutable BEFORE UPDATE ON eo_token FOR EACH ROW
          WHEN (NEW.message_id IS DISTINCT FROM OLD.message_id
                OR NEW.endpoint IS DISTINCT FROM OLD.endpoint
                OR NEW.type IS DISTINCT FROM OLD.type OR NEW.body IS DISTINCT FROM OLD.body
                OR NEW.headers IS DISTINCT FROM OLD.headers)
          EXECUTE FUNCTION eo_refuse_token_rewrite()""")
    op.execute("""
        CREATE TABLE eo_inbox_producer (
          role name NOT NULL,
          endpoint text NOT NULL,
          PRIMARY KEY (role, endpoint))""")
    op.execute("ALTER TABLE eo_inbox ENABLE ROW LEVEL SECURITY")
    # a producer reads (the keys of) its own rows only; the service, all
    op.execute("""
        CREATE POLICY eo_inbox_read ON eo_inbox FOR SELECT USING (
          producer = current_user OR NOT EXISTS (
            SELECT 1 FROM eo_inbox_producer g WHERE g.role = current_user))""")
    op.execute("CREATE POLICY eo_inbox_relay ON eo_inbox FOR UPDATE USING (true) "
               "WITH CHECK (true)")
    op.execute("CREATE POLICY eo_inbox_purge ON eo_inbox FOR DELETE USING (true)")
    op.execute("""
        CREATE POLICY eo_inbox_produce ON eo_inbox FOR INSERT WITH CHECK (
          producer = current_user AND EXISTS (
            SELECT 1 FROM eo_inbox_producer g
             WHERE g.role = current_user AND g.endpoint = eo_inbox.endpoint))""")


def downgrade() -> None:
    op.execute("DROP POLICY eo_inbox_produce ON eo_inbox")
    op.execute("DROP POLICY eo_inbox_purge ON eo_inbox")
    op.execute("DROP POLICY eo_inbox_relay ON eo_inbox")
    op.execute("DROP POLICY eo_inbox_read ON eo_inbox")
    op.execute("ALTER TABLE eo_inbox DISABLE ROW LEVEL SECURITY")
    op.execute("DROP TABLE eo_inbox_producer")
    op.execute("DROP TRIGGER eo_token_immutable ON eo_token")
    op.execute("DROP FUNCTION eo_refuse_token_rewrite()")
