"""`eo pipeline` for any service (here the counters', which has no sample, no TPC-H and no
declared blob prefix): a file of rows ingested into its gateway with natural IDs computed
by Spark (the same as Python's uuid5), and the audit's protocol findings for every endpoint
(stale tokens, tokens of dead letters, unfinished transactions, orphans under the prefixes
its states name, missing objects), then the sweep of the orphan it found."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import boto3
import pytest
from typer.testing import CliRunner

from adapters.postgres.pool import create_pool
from adapters.s3.moto_server import MotoServer
from adapters.system.clock import SystemClock
from application.codec import decode
from domain.context import Context
from entrypoints.local import postgres_stores
from tests.support.counters.endpoints import Add, Tally
from tests.support.counters.registry import REGISTRY, SPEC
from tests.support.processes import private_database, this_run
from tests.support.services import discover
from tools.pipeline.audit import FINDINGS
from tools.pipeline.cli import pipeline_app
from tools.pipeline.ingest import natural_id, natural_ids, producer_namespace
from tools.pipeline.parquet import read_rows

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

BUCKET = "eo-pipeline-any-service"


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    services = discover(rabbitmq=False)
    try:
        with private_database(services.postgres_dsn, this_run("eo_pipeline_any")) as dsn:
            yield dsn
    finally:
        services.close()


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    server = MotoServer()
    url = server.start()
    _s3(url).create_bucket(Bucket=BUCKET)
    yield url
    server.stop()


def _s3(url: str) -> Any:
    return boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


def _env(monkeypatch: pytest.MonkeyPatch, dsn: str, moto: str) -> None:
    for name, value in {"EO_PROFILE": "local", "EO_SERVICE": SPEC, "EO_DATABASE_DSN": dsn,
                        "EO_S3_ENDPOINT_URL": moto, "EO_S3_BUCKET": BUCKET,
                        "EO_S3_ACCESS_KEY": "test", "EO_S3_SECRET_KEY": "test"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("EO_TOKEN_DSN", raising=False)


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(pipeline_app, list(args))
    return result.exit_code, " ".join(result.output.split())


def test_natural_ids_are_pythons_uuid5(spark: SparkSession) -> None:
    namespace = producer_namespace("billing")
    rows = [(1, "a", Decimal("2.50")), (2, "b/c", Decimal("0.10")), (30, "é", Decimal("7"))]
    frame = spark.createDataFrame(rows, "n int, s string, d decimal(10,2)")
    found = [r[0] for r in frame.select(natural_ids(namespace, "Add", ["n", "s", "d"]))
             .collect()]
    assert found == [str(natural_id(namespace, "Add", [n, s, f"{d:.2f}"])) for n, s, d in rows]
    assert producer_namespace("billing") != producer_namespace("shipping")


async def _inbox(dsn: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetch("SELECT message_id, type, body FROM eo_inbox "
                                "WHERE endpoint = 'front' ORDER BY body")
    finally:
        await conn.close()


def test_a_file_is_ingested_into_any_gateway_once(
        dsn: str, moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, dsn, moto)
    rows = tmp_path / "adds.csv"
    rows.write_text("ref,counter,qty\nr1,c1,5\nr2,c2,7\nr3,c1,9\n")
    args = ["ingest", "--file", str(rows), "--endpoint", "front", "--type", "Add",
            "--id-columns", "ref", "--field", "amount=qty"]
    code, out = _invoke(*args)
    assert code == 0, out
    assert "rows: 3; new in front's inbox: 3" in out
    code, out = _invoke(*args)  # the same file again: the same IDs, nothing new
    assert code == 0, out
    assert "new in front's inbox: 0; already there: 3" in out
    inbox = asyncio.run(_inbox(dsn))
    namespace = producer_namespace("postgres")  # the DSN's user: the rows' producer
    assert {r["message_id"] for r in inbox} == {natural_id(namespace, "Add", [ref])
                                                for ref in ("r1", "r2", "r3")}
    assert {decode(Add, bytes(r["body"])) for r in inbox} == {Add("c1", 5), Add("c2", 7),
                                                               Add("c1", 9)}
    lines = tmp_path / "more.jsonl"  # JSON lines, fields by their own names
    lines.write_text(json.dumps({"ref": "r4", "counter": "c3", "amount": 1}) + "\n")
    code, out = _invoke("ingest", "--file", str(lines), "--endpoint", "front", "--type",
                        "Add", "--id-columns", "ref,counter")
    assert code == 0, out
    assert len(asyncio.run(_inbox(dsn))) == 4


@pytest.mark.parametrize(("args", "message"), [
    (["--endpoint", "counter"], "--endpoint counter: not a gateway of counters"),
    (["--type", "Nope"], "--type Nope: front takes Add, Spend"),
    (["--id-columns", "nope"], "--id-columns: nope: the message IDs come from columns"),
    (["--field", "amount=nope"], "no column for Add's field(s) amount (column nope)"),
])
def test_bad_ingest_options_exit_2_naming_them(
        dsn: str, moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        args: list[str], message: str) -> None:
    _env(monkeypatch, dsn, moto)
    rows = tmp_path / "adds.csv"
    rows.write_text("ref,counter,amount\nr1,c1,5\n")
    given = {"--endpoint": "front", "--type": "Add", "--id-columns": "ref"}
    given.update(dict(zip(args[::2], args[1::2], strict=True)))
    code, out = _invoke("ingest", "--file", str(rows),
                        *(x for pair in given.items() for x in pair))
    assert code == 2, out
    assert message in out


def _receipt() -> str:
    return Context(uuid.uuid4(), uuid.uuid4(), datetime.now(UTC)).artifact_key("receipts")


async def _seed(dsn: str, tallies: dict[str, Tally]) -> None:
    pool = await create_pool(dsn, max_size=1)
    try:
        await postgres_stores(pool, SystemClock(), REGISTRY)["counter"].seed_states(tallies)
    finally:
        await pool.close()


async def _sql(dsn: str, *statements: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def _audit(out: Path) -> tuple[int, str, dict[str, Any]]:
    code, text = _invoke("audit", "--output", str(out), "--older-than", "0",
                         "--no-dead-letters", "--partitions", "2", "--list-splits", "8")
    summary = json.loads((out / "summary.json").read_text()) if code in (0, 1) else {}
    return code, text, summary


def test_the_audit_finds_the_protocols_problems_for_any_service_and_the_sweep_its_orphan(
        spark: SparkSession, dsn: str, moto: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, dsn, moto)
    kept, lost, orphan = _receipt(), _receipt(), _receipt()
    asyncio.run(_seed(dsn, {"c1": Tally(total=3, receipts=(kept,)),
                            "c2": Tally(total=4, receipts=(lost,))}))
    s3 = _s3(moto)
    for key in (kept, lost, "exports/report.csv"):  # the last one is not the service's
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"r")

    code, out, summary = _audit(tmp_path / "clean")
    assert code == 0, out
    assert summary["counts"] == dict.fromkeys(FINDINGS, 0)
    assert summary["prefixes"] == ["receipts"]  # derived from what the counters' states name
    assert summary["service"] == "counters"

    s3.put_object(Bucket=BUCKET, Key=orphan, Body=b"r")
    s3.delete_object(Bucket=BUCKET, Key=lost)
    stale, dead, committed = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    asyncio.run(_sql(
        dsn,
        "INSERT INTO eo_token (message_id, endpoint, type, body, created_at) VALUES "
        f"('{stale}', 'counter', 'Add', '{{}}', now() - interval '1 hour'), "
        f"('{dead}', 'counter', 'Add', '{{}}', now() - interval '1 hour')",
        "INSERT INTO eo_dead_letter (endpoint, message_id, type, body, replayable, reasons, "
        f"first_at, last_at) VALUES ('counter', '{dead}', 'Add', '{{}}', true, '[]', now(), "
        "now())",
        f"UPDATE eo_transaction_record SET message_id = '{committed}', "
        f"attempt_id = '{uuid.uuid4()}', committed_at = now() - interval '1 hour' "
        "WHERE endpoint = 'counter' AND partition_key = 'c1'"))
    code, out, summary = _audit(tmp_path / "found")
    assert code == 1, out
    assert summary["counts"] == {"orphans": 1, "missing_objects": 1, "stale_tokens": 1,
                                 "dead_letter_tokens": 1, "stale_transactions": 1}
    found = tmp_path / "found"
    report = (found / "report.md").read_text()  # the framework's words, not the sample's
    assert ("| missing_objects | 1 | artifact keys named by committed states with no object "
            "in the bucket |") in report
    assert "invoice" not in report
    assert [r["key"] for r in read_rows(found / "orphans")] == [orphan]
    assert [(r["key"], r["endpoint"], r["partition_key"])
            for r in read_rows(found / "missing_objects")] == [(lost, "counter", "c2")]
    assert [r["message_id"] for r in read_rows(found / "stale_tokens")] == [str(stale)]
    assert [r["message_id"] for r in read_rows(found / "dead_letter_tokens")] == [str(dead)]
    assert [(r["endpoint"], r["message_id"]) for r in read_rows(found / "stale_transactions")
            ] == [("counter", str(committed))]

    code, out = _invoke("sweep", "--audit", str(found), "--apply")
    assert code == 0, out
    assert f"deleted: {orphan}" in out
    listed = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", ())}
    assert listed == {kept, "exports/report.csv"}
