"""`eo pipeline sweep` (registered on the pipeline's typer app in tools/pipeline/cli.py):
the orphan objects an `eo pipeline audit` found, deleted through the blob port
(tools/pipeline/sweep.py), a dry run unless asked.

Exit codes: 0 done; 2 bad input or settings (the message names the option or the EO_
variable); 3 a service failed while running.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from tools.pipeline.command import ProfileOption, fail, pipeline_service, pipeline_settings


def sweep_command(
    audit_dir: Annotated[Path, typer.Option(
        "--audit", help="the --output directory of `eo pipeline audit`")],
    apply: Annotated[bool, typer.Option(
        "--apply", help="delete; without it, a dry run lists what would be deleted")] = False,
    profile: ProfileOption = None,
) -> None:
    """Delete the orphan objects the audit found (every blob endpoint's), through the blob
    port; each key is checked again against the database first. A dry run unless --apply."""
    from application.errors import PermanentError, TransientError
    from tools.pipeline.audit_config import audit_config
    from tools.pipeline.sources import jdbc_of
    from tools.pipeline.sweep import SweepError, sweep

    settings = pipeline_settings(profile)
    service = pipeline_service(settings)
    console = Console()
    summary_path = audit_dir / "summary.json"
    summary: dict[str, Any] = {}
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        audited = summary.get("bucket")
        if not audited:  # an audit must say which bucket it listed, or it is not swept
            raise fail(f"--audit {audit_dir}: summary.json names no bucket: refused", 2)
        if audited != settings.bucket():
            raise fail(f"--audit {audit_dir} audited bucket {audited!r}, but EO_S3_BUCKET is "
                       f"{settings.bucket()!r}", 2)
    config = audit_config(service, jdbc_of(settings.database()),
                          jdbc_of(settings.tokens_database()), datetime.now(UTC), 0.0)
    prefixes = config.prefixes
    if prefixes is None:  # undeclared: those the audit derived from what the states name
        prefixes = tuple(summary.get("prefixes") or ())
    blobs = settings.blobs
    try:
        result = asyncio.run(sweep(
            audit_dir, settings.database(), settings.bucket(), blobs.s3_endpoint_url,
            blobs.s3_region,
            blobs.s3_access_key.get_secret_value() if blobs.s3_access_key else None,
            blobs.s3_secret_key.get_secret_value() if blobs.s3_secret_key else None,
            config.states, prefixes, apply=apply,
            on_key=lambda action, key: console.print(f"{action}: {key}", highlight=False)))
    except SweepError as exc:
        raise fail(str(exc), 2) from exc
    except (OSError, PermanentError, TransientError) as exc:
        raise fail(f"sweep failed: {type(exc).__name__}: {exc}", 3) from exc
    verb = "deleted" if apply else "would delete (dry run; --apply deletes)"
    console.print(f"orphans in the audit: {len(result.orphans):,}; {verb}: "
                  f"{len(result.deleted):,}; skipped (named now): {len(result.skipped):,}; "
                  f"skipped (not the service's): {len(result.foreign):,}")
