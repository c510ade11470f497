"""`eo pipeline sweep`: delete the orphan objects an audit found, through the blob port.

Dry run unless asked to apply. Before deleting, every key is checked again against the
database (a side-effect record, a deferred clean-up or an order state naming it since the
audit ran makes it no orphan any more), so an old audit cannot delete a live object.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from adapters.s3.blob_store import S3BlobStore, s3_client_resource
from entrypoints.pipeline.audit import read_rows

log = logging.getLogger("eo.pipeline.sweep")

#: Keys among $1 that some record names now (the audit's notion of "named").
NAMED_NOW = """
SELECT key FROM eo_side_effect_record WHERE kind = 'blob' AND key = ANY($1::text[])
UNION SELECT key FROM eo_deferred_cleanup WHERE kind = 'blob' AND key = ANY($1::text[])
UNION SELECT state->>'invoice_key' FROM eo_transaction_record
 WHERE endpoint = 'orders' AND state->>'invoice_key' = ANY($1::text[])"""


class SweepError(RuntimeError):
    """The audit output cannot be swept (missing, or from another bucket)."""


@dataclass
class SweepResult:
    """Keys the audit listed as orphans, those deleted (or, in a dry run, to delete) and
    those skipped because a record names them now."""

    orphans: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    applied: bool = False


def orphan_keys(audit_dir: Path) -> list[str]:
    """The keys in `audit_dir/orphans` (Parquet written by `eo pipeline audit`), sorted.

    Raises SweepError when the directory holds no audit output.
    """
    path = audit_dir / "orphans"
    if not (audit_dir / "summary.json").is_file() or not path.is_dir():
        raise SweepError(f"--audit {audit_dir}: no audit output (summary.json and orphans/); "
                         "run `eo pipeline audit --output DIR` first")
    return sorted(str(row["key"]) for row in read_rows(path))


async def named_now(dsn: str, keys: list[str]) -> set[str]:
    """Those of `keys` a record of the database at `dsn` names now."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return {r["key"] for r in await conn.fetch(NAMED_NOW, keys)}
    finally:
        await conn.close()


async def sweep(
    audit_dir: Path,
    dsn: str,
    bucket: str,
    endpoint_url: str | None,
    region: str,
    access_key: str | None,
    secret_key: str | None,
    apply: bool = False,
    on_key: Callable[[str, str], None] = lambda _action, _key: None,
) -> SweepResult:
    """Delete (with `apply`) the audit's orphan objects from `bucket` through S3BlobStore,
    skipping keys a record of `dsn` names now. Each key is logged (logger
    `eo.pipeline.sweep`) and passed to `on_key` with its action: "deleted", "would delete"
    or "skipped (named now)".

    Raises SweepError (see `orphan_keys`), asyncpg/OSError when the database does not answer,
    and the blob port's PermanentError/TransientError when S3 refuses.
    """
    result = SweepResult(orphans=orphan_keys(audit_dir), applied=apply)
    if not result.orphans:
        return result
    named = await named_now(dsn, result.orphans)
    action = "deleted" if apply else "would delete"
    async with s3_client_resource(endpoint_url, region, access_key, secret_key) as client:
        store = S3BlobStore(client, bucket)
        for key in result.orphans:
            if key in named:
                result.skipped.append(key)
                log.warning("orphan %s skipped: a record names it now", key)
                on_key("skipped (named now)", key)
                continue
            if apply:
                await store.delete(key)
            result.deleted.append(key)
            log.info("orphan %s %s", key, action)
            on_key(action, key)
    return result
