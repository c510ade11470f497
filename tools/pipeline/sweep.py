"""`eo pipeline sweep`: delete the orphan objects an audit found, through the blob port, for
every blob endpoint of the service.

Dry run unless asked to apply. It touches only the service's own keys
(`domain.context.is_artifact_key` under the blob endpoints' prefixes: those the registry
declares, else those the audit derived): any other object of the bucket is not its to
delete, whatever the audit says. Before deleting, every key is checked again against the
database (a side-effect record, a deferred clean-up or a state naming it since the audit
ran makes it no orphan any more), so an old audit cannot delete a live object.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from adapters.postgres.admin import blob_keys_named
from adapters.s3.blob_store import S3BlobStore, s3_client_resource
from domain.context import is_artifact_key
from tools.pipeline.parquet import read_rows

log = logging.getLogger("eo.pipeline.sweep")


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


async def named_now(dsn: str, keys: list[str], states: Mapping[str, Sequence[str]]
                    ) -> set[str]:
    """Those of `keys` a record of the database at `dsn` names now: a blob side-effect
    record, a deferred clean-up, or a state of an endpoint of `states` (endpoint -> the
    fields naming blobs; empty: any artifact key in the state)."""
    return await blob_keys_named(
        dsn, keys, [(e, f) for e, fields in states.items() for f in fields],
        [e for e, fields in states.items() if not fields])


async def sweep(
    audit_dir: Path,
    dsn: str,
    bucket: str,
    endpoint_url: str | None,
    region: str,
    access_key: str | None,
    secret_key: str | None,
    states: Mapping[str, Sequence[str]],
    prefixes: Sequence[str],
    apply: bool = False,
    on_key: Callable[[str, str], None] = lambda _action, _key: None,
) -> SweepResult:
    """Delete (with `apply`) the audit's orphan objects from `bucket` through S3BlobStore,
    skipping keys that are not the service's (artifact keys under `prefixes`) and keys a
    record of `dsn` names now (`named_now` with `states`). Each key is logged (logger
    `eo.pipeline.sweep`) and passed to `on_key` with its action: "deleted", "would delete",
    "skipped (not the service's)" or "skipped (named now)".

    Raises SweepError (see `orphan_keys`), asyncpg/OSError when the database does not answer,
    and the blob port's PermanentError/TransientError when S3 refuses.
    """
    result = SweepResult(orphans=orphan_keys(audit_dir), applied=apply)
    ours = []
    for key in result.orphans:
        if is_artifact_key(key, prefixes):
            ours.append(key)
        else:
            result.foreign.append(key)
            log.warning("object %s skipped: not a key of the service", key)
            on_key("skipped (not the service's)", key)
    if not ours:
        return result
    named = await named_now(dsn, ours, states)
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
