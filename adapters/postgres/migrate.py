"""Schema migrations with alembic (`eo migrate`, and at start-up when configured)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from alembic import command
from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")


def sqlalchemy_url(dsn: str) -> str:
    """`postgresql://...` as SQLAlchemy's asyncpg URL; a multi-host DSN (`user@h1:p1,h2:p2/db`,
    a primary and its standbys) becomes SQLAlchemy's form of it, `host=h1:p1&host=h2:p2`
    query parameters. Raises ValueError for other schemes."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres", "postgresql+asyncpg"):
        raise ValueError("expected a postgresql:// DSN")
    user, at, hosts = parts.netloc.rpartition("@")
    if "," in hosts:
        query = "&".join([*(f"host={host}" for host in hosts.split(",")),
                          *([parts.query] if parts.query else [])])
        parts = parts._replace(netloc=f"{user}{at}", query=query)
    return urlunsplit(parts._replace(scheme="postgresql+asyncpg"))


def _config(dsn: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    # '%' would be read as interpolation by configparser
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(dsn).replace("%", "%%"))
    return config


def upgrade(dsn: str, revision: str = "head") -> None:
    """Apply migrations up to `revision` (idempotent). Blocking: call it in a thread from
    async code (`upgrade_async`)."""
    command.upgrade(_config(dsn), revision)


async def upgrade_async(dsn: str, revision: str = "head") -> None:
    """`upgrade` off the event loop (alembic's env runs its own loop)."""
    await asyncio.to_thread(upgrade, dsn, revision)


def downgrade(dsn: str, revision: str) -> None:
    """Revert migrations down to `revision` (stop the workers first: older code may not read
    what newer code wrote). Blocking, as `upgrade`."""
    command.downgrade(_config(dsn), revision)


async def downgrade_async(dsn: str, revision: str) -> None:
    """`downgrade` off the event loop."""
    await asyncio.to_thread(downgrade, dsn, revision)


def head_revision() -> str:
    """The newest migration's revision ID (what `eo_schema_version` holds once migrated)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config("postgresql://unused/unused")).get_current_head()
    if head is None:
        raise RuntimeError("no migrations found")
    return head
