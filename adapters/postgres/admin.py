"""Operator queries on the PostgreSQL side: create and drop a database, and what the
protocol's tables hold (`eo inspect`)."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from application.errors import PermanentError
from domain.context import ARTIFACT_KEY_IN_TEXT

#: libpq connection parameters that hold secrets, also in a DSN's query string
_SECRET_PARAMETERS = frozenset({"password", "sslpassword"})


def redacted_dsn(dsn: str) -> str:
    """`dsn` safe to log or write down: the password of its user part and the values of
    `password` / `sslpassword` query parameters replaced by `***`."""
    parts = urlsplit(dsn)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rsplit('@', 1)[-1]}"
    query = "&".join(
        f"{name}=***" if name.lower() in _SECRET_PARAMETERS else f"{name}={value}"
        for name, value in (pair.partition("=")[::2] for pair in parts.query.split("&") if pair))
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def database_name(dsn: str) -> str:
    """The database a DSN names."""
    return urlsplit(dsn).path.lstrip("/")


def database_refusal(exc: asyncpg.PostgresError, dsn: str) -> PermanentError:
    """What PostgreSQL's refusal to open the database of `dsn` tells an operator, as the
    `PermanentError` a command or start-up raises (no wait fixes it): a missing database
    ("run `eo migrate`"), refused credentials, no pg_hba.conf entry. Names the database,
    never the DSN (it may hold a password)."""
    name = database_name(dsn)
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return PermanentError(f"database {name!r} does not exist: run `eo migrate`")
    return PermanentError(f"PostgreSQL database {name!r}: {type(exc).__name__}: {exc}")


def quoted(identifier: str) -> str:
    """`identifier` as a quoted SQL identifier (embedded quotes doubled)."""
    return '"' + identifier.replace('"', '""') + '"'


def with_database(dsn: str, name: str) -> str:
    """`dsn` pointing at the database `name` on the same server."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


def _server(dsn: str) -> str:
    """The server's own `postgres` database, where databases are created and dropped."""
    return with_database(dsn, "postgres")


async def drop_database(dsn: str) -> None:
    """Drop the database `dsn` names, closing its sessions first (PostgreSQL 13+); no error
    when it does not exist. Raises asyncpg's errors."""
    admin = await asyncpg.connect(_server(dsn))
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {quoted(database_name(dsn))} WITH (FORCE)")
    finally:
        await admin.close()


async def ensure_database(dsn: str) -> bool:
    """Create the database named by `dsn` when it does not exist (connecting to the server's
    `postgres` database). Returns True when it created it. Raises asyncpg's errors."""
    try:
        conn = await asyncpg.connect(dsn)
    except asyncpg.InvalidCatalogNameError:
        admin = await asyncpg.connect(_server(dsn))
        try:
            await admin.execute(f"CREATE DATABASE {quoted(database_name(dsn))}")
        finally:
            await admin.close()
        return True
    await conn.close()
    return False


_EVERY_STATE = ("(SELECT endpoint, state FROM eo_transaction_record WHERE state IS NOT NULL "
                "UNION ALL SELECT endpoint, state FROM eo_state_entry WHERE state IS NOT NULL)")
_BLOB_KEYS_NAMED = f"""
SELECT key FROM eo_side_effect_record WHERE kind = 'blob' AND key = ANY($1::text[])
UNION SELECT key FROM eo_deferred_cleanup WHERE kind = 'blob' AND key = ANY($1::text[])
UNION SELECT s.state->>f.field FROM {_EVERY_STATE} AS s
  JOIN unnest($2::text[], $3::text[]) AS f(endpoint, field) ON s.endpoint = f.endpoint
 WHERE s.state->>f.field = ANY($1::text[])
UNION SELECT m[1] FROM {_EVERY_STATE} AS s, regexp_matches(s.state::text, $5, 'g') AS m
 WHERE s.endpoint = ANY($4::text[]) AND m[1] = ANY($1::text[])"""


async def blob_keys_named(dsn: str, keys: Sequence[str],
                          state_fields: Sequence[tuple[str, str]] = (),
                          searched: Sequence[str] = ()) -> set[str]:
    """Those of `keys` that the database at `dsn` names now: a blob side-effect record, a
    deferred clean-up, the top-level JSON field `field` of an endpoint's business state for
    each `(endpoint, field)` of `state_fields` (e.g. `("orders", "invoice_key")`), or any
    artifact key (`domain.context.ARTIFACT_KEY_IN_TEXT`) in a state of an endpoint of
    `searched`; every version of a state stream counts. Raises asyncpg's errors and OSError
    when the database does not answer."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        rows = await conn.fetch(_BLOB_KEYS_NAMED, list(keys),
                                [e for e, _ in state_fields], [f for _, f in state_fields],
                                list(searched), ARTIFACT_KEY_IN_TEXT)
        return {r[0] for r in rows if r[0] is not None}
    finally:
        await conn.close()
