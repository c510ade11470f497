"""Alembic environment: runs the migrations on an asyncpg engine (online mode only)."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=None,
                      version_table="eo_schema_version")
    with context.begin_transaction():
        context.run_migrations()


async def _online() -> None:
    engine = create_async_engine(context.config.get_main_option("sqlalchemy.url") or "")
    async with engine.connect() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported: run `eo migrate` against a server")
asyncio.run(_online())
