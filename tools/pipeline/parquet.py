"""The Parquet datasets Spark writes (the audit's findings), read back through DuckDB without
a Spark job: their row counts and their rows."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC
from pathlib import Path
from typing import Any

from tools.pipeline.sources import sql_literal


def _parquet_source(path: Path) -> str:
    """`read_parquet('<path>/*.parquet')` with the path as an escaped SQL string literal."""
    return f"read_parquet({sql_literal((path / '*.parquet').as_posix())})"


def _identifier(name: str) -> str:
    """`name` as a quoted SQL identifier (embedded quotes doubled): a column name read from
    a file must never become SQL (the security review ran `COPY ... TO` through one)."""
    return '"' + name.replace('"', '""') + '"'


def count_rows(path: Path) -> int:
    """Rows of the Parquet dataset Spark wrote to directory `path` (from the files' footers,
    through DuckDB: no Spark job)."""
    import duckdb

    if not any(path.glob("*.parquet")):
        return 0
    with duckdb.connect() as con:
        found = con.execute(f"SELECT count(*) FROM {_parquet_source(path)}").fetchone()
    return int(found[0]) if found else 0


def read_rows(path: Path, limit: int | None = None,
              columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Rows of the Parquet dataset in directory `path` as dicts (Decimal, list, datetime
    values), at most `limit` of them (None: all), with `columns` only when given (a fixed
    set: a missing one raises duckdb's BinderException). Column names are quoted, never
    trusted as SQL."""
    import duckdb

    if not any(path.glob("*.parquet")):
        return []
    source = _parquet_source(path)
    with duckdb.connect() as con:
        described = con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()
        kinds = {str(name): str(kind) for name, kind, *_ in described}
        wanted = list(columns) if columns is not None else list(kinds)
        # instants as naive UTC (DuckDB needs pytz for aware ones), made aware below
        aware = {n for n in wanted if "WITH TIME ZONE" in kinds.get(n, "")}
        selected = ", ".join(
            f"timezone('UTC', {_identifier(n)}) AS {_identifier(n)}" if n in aware
            else _identifier(n) for n in wanted)
        query = f"SELECT {selected} FROM {source}"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        cursor = con.execute(query)
        names = [d[0] for d in cursor.description or ()]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    for row in rows:
        for name in aware:
            if row[name] is not None:
                row[name] = row[name].replace(tzinfo=UTC)
    return rows
