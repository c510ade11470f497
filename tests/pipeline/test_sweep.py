"""`eo pipeline sweep`: dry run by default, deletes through the blob port with --apply, and
never deletes an object a record names by now."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import duckdb
import pytest
from typer.testing import CliRunner

from adapters.s3.moto_server import MotoServer
from entrypoints.pipeline.cli import pipeline_app
from tests.pipeline.audit_data import fresh_database, s3_client
from tests.support.services import discover

BUCKET = "eo-pipeline-sweep"


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    services = discover(rabbitmq=False)
    yield asyncio.run(fresh_database(services.postgres_dsn, "eo_pipeline_sweep_test"))
    services.close()


@pytest.fixture
def moto() -> Iterator[str]:
    server = MotoServer()
    url = server.start()
    s3_client(url).create_bucket(Bucket=BUCKET)
    yield url
    server.stop()


def _audit_dir(tmp_path: Path, keys: list[str], bucket: str = BUCKET) -> Path:
    out = tmp_path / "audit"
    (out / "orphans").mkdir(parents=True)
    (out / "summary.json").write_text(json.dumps({"bucket": bucket, "counts": {}}))
    values = ", ".join(f"('{k}', 1::BIGINT, TIMESTAMP '2025-01-01')" for k in keys)
    with duckdb.connect() as con:
        con.execute(f"COPY (SELECT * FROM (VALUES {values}) AS t(key, size, last_modified)) "
                    f"TO '{out}/orphans/part-0.parquet' (FORMAT parquet)")
    return out


async def _name(dsn: str, key: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO eo_side_effect_record (endpoint, partition_key, kind, key, incoming_id,"
            " attempt_id, seq, registered_at) VALUES ('orders', '1', 'blob', $1, $2, $3, 0, $4)",
            key, uuid.uuid4(), uuid.uuid4(), datetime.now(UTC))
    finally:
        await conn.close()


def _keys(moto: str) -> set[str]:
    listed = s3_client(moto).list_objects_v2(Bucket=BUCKET).get("Contents", ())
    return {o["Key"] for o in listed}


def _run(moto: str, dsn: str, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    for name, value in {"EO_PROFILE": "local", "EO_DATABASE_DSN": dsn,
                        "EO_S3_ENDPOINT_URL": moto, "EO_S3_BUCKET": BUCKET,
                        "EO_S3_ACCESS_KEY": "test", "EO_S3_SECRET_KEY": "test"}.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(pipeline_app, ["sweep", *args])
    return result.exit_code, " ".join(result.output.split())


def test_dry_run_then_apply_deletes_the_orphans_but_not_a_key_named_since(
        moto: str, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    orphan, named, kept = (f"invoices/{uuid.uuid4()}" for _ in range(3))
    for key in (orphan, named, kept):
        s3_client(moto).put_object(Bucket=BUCKET, Key=key, Body=b"x")
    audit = _audit_dir(tmp_path, [orphan, named])
    asyncio.run(_name(dsn, named))  # registered after the audit: in flight now

    code, out = _run(moto, dsn, monkeypatch, "--audit", str(audit))
    assert code == 0, out
    assert f"would delete: {orphan}" in out
    assert f"skipped (named now): {named}" in out
    assert _keys(moto) == {orphan, named, kept}

    code, out = _run(moto, dsn, monkeypatch, "--audit", str(audit), "--apply")
    assert code == 0, out
    assert f"deleted: {orphan}" in out
    assert "deleted: 1; skipped (named now): 1" in out
    assert _keys(moto) == {named, kept}


def test_an_audit_of_another_bucket_is_refused(
        moto: str, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    audit = _audit_dir(tmp_path, ["invoices/x"], bucket="eo-other")
    code, out = _run(moto, dsn, monkeypatch, "--audit", str(audit), "--apply")
    assert code == 2
    assert "eo-other" in out


def test_a_missing_audit_is_named(moto: str, dsn: str, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = _run(moto, dsn, monkeypatch, "--audit", str(tmp_path / "none"))
    assert code == 2
    assert "no audit output" in out
