"""Schema migrations with alembic (`eo migrate`, and at start-up when configured)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Upgrade:
    """What `upgrade_reporting` did to one database: its revision before (None: no schema
    yet) and after, and the revisions it applied in order, each `(revision, its docstring's
    first line)`."""

    before: str | None
    after: str | None
    applied: tuple[tuple[str, str], ...]

    def line(self, database: str) -> str:
        """`database eo: 0009 -> 0013, 4 revisions applied:` and a line per revision
        (`  0010 <its summary>`), or `database eo: at 0013, up to date`."""
        if not self.applied:
            return f"database {database}: at {self.after}, up to date"
        steps = "".join(f"\n  {rev} {doc}".rstrip() for rev, doc in self.applied)
        return (f"database {database}: {self.before or 'empty'} -> {self.after}, "
                f"{len(self.applied)} revisions applied:{steps}")


def summary(doc: str | None, width: int = 100) -> str:
    """A migration docstring's first sentence (of its first paragraph), at most `width`
    characters."""
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    end = paragraph.find(". ")
    sentence = paragraph if end < 0 else paragraph[:end + 1]
    return sentence if len(sentence) <= width else sentence[:width - 1].rstrip() + "\u2026"


async def stored_revision(dsn: str) -> str | None:
    """The revision `eo_schema_version` holds, None when the database has no schema yet.
    Raises what asyncpg raises when the database cannot be reached."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        revision = await conn.fetchval("SELECT version_num FROM eo_schema_version")
    except asyncpg.UndefinedTableError:
        return None
    finally:
        await conn.close()
    return None if revision is None else str(revision)


async def upgrade_reporting(dsn: str) -> Upgrade:
    """`upgrade_async` to the newest revision, saying which revisions it applied (read from
    `eo_schema_version` before and after, and alembic's revision graph between them)."""
    from alembic.script import ScriptDirectory

    before = await stored_revision(dsn)
    await upgrade_async(dsn)
    after = await stored_revision(dsn)
    script = ScriptDirectory.from_config(_config("postgresql://unused/unused"))
    applied = [] if after == before or after is None else [
        (r.revision, summary(r.module.__doc__ or r.doc))
        for r in script.iterate_revisions(after, before)]
    return Upgrade(before, after, tuple(reversed(applied)))


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
