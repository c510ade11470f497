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

from adapters.postgres.admin import drop_database
from adapters.s3.moto_server import MotoServer
from domain.context import Context
from tests.sample.pipeline.audit_data import fresh_database, s3_client
from tests.support.processes import this_run
from tests.support.services import discover
from tools.pipeline.cli import pipeline_app
from tools.pipeline.parquet import read_rows

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

BUCKET = "eo-pipeline-sweep"


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    services = discover(rabbitmq=False)
    dsn = asyncio.run(fresh_database(services.postgres_dsn, this_run("eo_pipeline_sweep_test")))
    try:
        yield dsn
    finally:
        asyncio.run(drop_database(dsn))
        services.close()


@pytest.fixture
def moto() -> Iterator[str]:
    server = MotoServer()
    url = server.start()
    s3_client(url).create_bucket(Bucket=BUCKET)
    yield url
    server.stop()


def _key() -> str:
    """An invoice key as the orders handler makes one."""
    return Context(uuid.uuid4(), uuid.uuid4(), datetime.now(UTC)).artifact_key("invoices")


def _audit_dir(tmp_path: Path, keys: list[str], bucket: str | None = BUCKET) -> Path:
    out = tmp_path / "audit"
    (out / "orphans").mkdir(parents=True)
    summary = {"counts": {}} if bucket is None else {"bucket": bucket, "counts": {}}
    (out / "summary.json").write_text(json.dumps(summary))
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
    orphan, named, kept = (_key() for _ in range(3))
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


def test_objects_that_are_not_the_services_keys_are_never_deleted(
        moto: str, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The security review: every object the database does not name was an orphan, so a
    bucket shared with anything else lost objects. Only `invoices/<uuid5>` keys are ours."""
    orphan, foreign = _key(), ["reports/2026-01.csv", f"invoices/{uuid.uuid4()}", "invoices/x"]
    for key in (orphan, *foreign):
        s3_client(moto).put_object(Bucket=BUCKET, Key=key, Body=b"x")
    audit = _audit_dir(tmp_path, [orphan, *foreign])  # an audit that listed them anyway
    code, out = _run(moto, dsn, monkeypatch, "--audit", str(audit), "--apply")
    assert code == 0, out
    assert f"deleted: {orphan}" in out
    assert "skipped (not the service's): 3" in out
    left = _keys(moto)  # moto's store outlives a test's server: compare what is ours
    assert orphan not in left
    assert set(foreign) <= left


def test_an_audit_that_names_no_bucket_is_refused(
        moto: str, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = _key()
    s3_client(moto).put_object(Bucket=BUCKET, Key=key, Body=b"x")
    code, out = _run(moto, dsn, monkeypatch, "--audit", str(_audit_dir(tmp_path, [key], None)),
                     "--apply")
    assert code == 2
    assert "names no bucket" in out
    assert key in _keys(moto)


def test_a_crafted_column_name_in_the_audit_is_data_never_sql(tmp_path: Path) -> None:
    """The security review wrote a file through a column name of the audit's Parquet: the
    reader built SQL from it. Identifiers are quoted now, and the sweep reads `key` only."""
    out = tmp_path / "audit" / "orphans"
    out.mkdir(parents=True)
    written = tmp_path / "pwned.csv"
    evil = f"""x" FROM range(1); COPY (SELECT 42) TO '{written}'; SELECT "x"""
    with duckdb.connect() as con:
        con.execute(f"""COPY (SELECT 'invoices/k' AS key, 1 AS "{evil.replace('"', '""')}")
                        TO '{out}/part-0.parquet' (FORMAT parquet)""")
    rows = read_rows(out)
    assert rows == [{"key": "invoices/k", evil: 1}]
    assert read_rows(out, columns=("key",)) == [{"key": "invoices/k"}]
    assert not written.exists()
