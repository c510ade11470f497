"""`eo pipeline sweep`: delete the orphan objects an audit found, through the blob port.

Dry run unless asked to apply. It touches only the service's own keys
(`domain.context.is_artifact_key` under `ARTIFACT_PREFIXES`): any other object of the
bucket is not its to delete, whatever the audit says. Before deleting, every key is checked
again against the database (a side-effect record, a deferred clean-up or an order state
naming it since the audit ran makes it no orphan any more), so an old audit cannot delete a
live object.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from adapters.postgres.admin import blob_keys_named
from adapters.s3.blob_store import S3BlobStore, s3_client_resource
from domain.context import is_artifact_key
from tools.pipeline.audit import ARTIFACT_PREFIXES, read_rows

log = logging.getLogger("eo.pipeline.sweep")

#: Business-state fields that name blobs in the sample (an order's invoice).
STATE_FIELDS = (("orders", "invoice_key"),)



class SweepError(RuntimeError):
    """The audit output cannot be swept (missing, or from another bucket)."""


@dataclass
class SweepResult:
    """Keys the audit listed as orphans, those deleted (or, in a dry run, to delete), those
    skipped because a record names them now, and those that are not the service's keys
    (`foreign`: never deleted)."""

    orphans: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    applied: bool = False


def orphan_keys(audit_dir: Path) -> list[str]:
    """The keys in `audit_dir/orphans` (Parquet written by `eo pipeline audit`), sorted.

    Raises SweepError when the directory holds no audit output.
    """
    path = audit_dir / "orphans"
    if not (audit_dir / "summary.json").is_file() or not path.is_dir():
        raise SweepError(f"--audit {audit_dir}: no audit output (summary.json and orphans/); "
                         "run `eo pipeline audit --output DIR` first")
    return sorted(str(row["key"]) for row in read_rows(path, columns=("key",)))


async def named_now(dsn: str, keys: list[str]) -> set[str]:
    """Those of `keys` a record of the database at `dsn` names now."""
    return await blob_keys_named(dsn, keys, STATE_FIELDS)


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
    skipping keys that are not the service's (`ARTIFACT_PREFIXES`) and keys a record of
    `dsn` names now. Each key is logged (logger `eo.pipeline.sweep`) and passed to `on_key`
    with its action: "deleted", "would delete", "skipped (not the service's)" or "skipped
    (named now)".

    Raises SweepError (see `orphan_keys`), asyncpg/OSError when the database does not answer,
    and the blob port's PermanentError/TransientError when S3 refuses.
    """
    result = SweepResult(orphans=orphan_keys(audit_dir), applied=apply)
    ours = []
    for key in result.orphans:
        if is_artifact_key(key, ARTIFACT_PREFIXES):
            ours.append(key)
        else:
            result.foreign.append(key)
            log.warning("object %s skipped: not a key of the service", key)
            on_key("skipped (not the service's)", key)
    if not ours:
        return result
    named = await named_now(dsn, ours)
    action = "deleted" if apply else "would delete"
    async with s3_client_resource(endpoint_url, region, access_key, secret_key) as client:
        store = S3BlobStore(client, bucket)
        for key in ours:
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
