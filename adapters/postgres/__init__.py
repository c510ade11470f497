"""PostgreSQL adapters (asyncpg): tokens, transaction and side-effect records, inbox, state."""
