"""`eo pipeline audit` against a real PostgreSQL and a moto server: the Spark oracle equals
the Python one, a clean run reports nothing, each injected violation is reported."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest
from typer.testing import CliRunner

from adapters.postgres.admin import drop_database
from adapters.s3.moto_server import MotoServer
from domain.context import Context
from domain.sample.orders import CONFIRMED
from tests.sample.pipeline import audit_data as data
from tests.sample.pipeline.cluster import eo_elsewhere
from tests.support.processes import this_run
from tests.support.services import discover
from tools.pipeline.audit import FINDINGS, AuditResult
from tools.pipeline.cli import pipeline_app
from tools.pipeline.named_keys import orphan_objects
from tools.pipeline.parquet import read_rows
from tools.tpch.audit import TpchAudit
from tools.tpch.audit_findings import oracle, order_findings
from tools.tpch.audit_input import read_input
from tools.tpch.audit_states import ledgers_query, typed_orders
from tools.tpch.data import TpchSample, generate
from tools.tpch.oracle import check_oracle

pytestmark = pytest.mark.slow(minutes=4)  # with the rest of the "spark" group

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ORDERS = 24
REAL_NOW = datetime.now(UTC)
#: Audit "two hours from now" with a one-hour threshold: the fixture's objects (put now) are
#: old enough to be orphans; rows stamped after REAL_NOW + 1 h are too young to count.
AUDIT_NOW = REAL_NOW + timedelta(hours=2)
OLDER_THAN_S = 3600.0


@pytest.fixture(scope="module")
def server_dsn() -> Iterator[str]:
    services = discover(rabbitmq=False)
    yield services.postgres_dsn
    services.close()


@pytest.fixture(scope="module")
def sample() -> TpchSample:
    return generate(data.SF)


@pytest.fixture(scope="module")
def order_keys(sample: TpchSample) -> list[int]:
    return sorted(sample.expected)[:ORDERS]


@pytest.fixture(scope="module")
def input_dir(tmp_path_factory: pytest.TempPathFactory, order_keys: list[int]) -> Path:
    return data.write_input(tmp_path_factory.mktemp("tpch"), order_keys)


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    server = MotoServer()
    yield server.start()
    server.stop()


@dataclass
class Scenario:
    dsn: str
    bucket: str
    world: data.World
    injected: dict[str, Any]


@pytest.fixture(scope="module")
def clean(server_dsn: str, sample: TpchSample, order_keys: list[int], moto: str
          ) -> Iterator[Scenario]:
    world = data.settle(sample, order_keys)
    dsn = asyncio.run(data.fresh_database(server_dsn, this_run("eo_pipeline_audit_clean")))
    try:
        asyncio.run(data.store(dsn, world))
        data.put_invoices(moto, "eo-pipeline-clean", world)
        yield Scenario(dsn, "eo-pipeline-clean", world, {})
    finally:
        asyncio.run(drop_database(dsn))


async def _inject_rows(dsn: str, injected: dict[str, Any]) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO eo_token (endpoint, message_id, type, body, created_at) VALUES "
            "('orders', $1, 'AddItem', '\\x7b7d', $2), ('orders', $3, 'AddItem', '\\x7b7d', $4)",
            injected["stale_token"], REAL_NOW - timedelta(minutes=5),
            uuid.uuid4(), REAL_NOW + timedelta(minutes=90))  # the second one is too young
        await conn.execute(
            "UPDATE eo_transaction_record SET message_id = $3, attempt_id = $4, "
            "committed_at = $5 WHERE endpoint = $1 AND partition_key = $2",
            "orders", str(injected["stale_transaction"]), uuid.uuid4(), uuid.uuid4(),
            REAL_NOW - timedelta(minutes=5))
        in_flight, deferred = injected["in_flight"], injected["deferred"]
        await conn.execute(
            "INSERT INTO eo_side_effect_record (endpoint, partition_key, kind, key, incoming_id,"
            " attempt_id, seq, registered_at) VALUES ('orders', '1', 'blob', $1, $2, $3, 0, $4)",
            in_flight, uuid.uuid4(), uuid.uuid4(), REAL_NOW)
        await conn.execute(
            "INSERT INTO eo_deferred_cleanup (endpoint, kind, key, due) "
            "VALUES ('orders', 'blob', $1, $2)", deferred, REAL_NOW)
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def injected(server_dsn: str, sample: TpchSample, order_keys: list[int], moto: str
             ) -> Iterator[Scenario]:
    world = data.settle(sample, order_keys)
    confirmed = [k for k in order_keys if world.orders[k].status == CONFIRMED]
    doubled, wrong, twice, stale, lost, short = confirmed[:6]
    world.orders[doubled] = data.doubled_line(world.orders[doubled])
    world.orders[short] = data.missing_line(world.orders[short])
    world.orders[wrong] = data.wrong_total(world.orders[wrong])
    customer = world.orders[twice].customer_key
    assert customer is not None
    world.ledgers[customer] = data.doubled_confirmation(world.ledgers[customer],
                                                        world.orders[twice])
    lost_key = world.orders[lost].invoice_key
    assert lost_key is not None
    del world.invoices[lost_key]
    marks = {"doubled_line": doubled, "wrong_total": wrong, "missing_line": short, "twice": twice,
             "twice_customer": customer, "stale_transaction": stale, "lost_invoice": lost_key,
             "orphan": _invoice_key(), "in_flight": _invoice_key(), "deferred": _invoice_key(),
             "stale_token": uuid.uuid4(),
             # objects of someone else sharing the bucket: never orphans of ours
             "foreign": "reports/2026-01.csv", "foreign_shape": f"invoices/{uuid.uuid4()}"}
    bucket = "eo-pipeline-injected"
    dsn = asyncio.run(data.fresh_database(server_dsn, this_run("eo_pipeline_audit_injected")))
    try:
        asyncio.run(data.store(dsn, world))
        asyncio.run(_inject_rows(dsn, marks))
        data.put_invoices(moto, bucket, world)
        client = data.s3_client(moto)
        for name in ("orphan", "in_flight", "deferred", "foreign", "foreign_shape"):
            client.put_object(Bucket=bucket, Key=marks[name], Body=b"x")
        yield Scenario(dsn, bucket, world, marks)
    finally:
        asyncio.run(drop_database(dsn))


def test_spark_oracle_equals_the_python_oracle(spark: SparkSession, input_dir: Path,
                                               sample: TpchSample) -> None:
    full = input_dir.parent / "full"  # all of sf=0.001, as write_input exported it
    rows = oracle(read_input(spark, full).lineitem).collect()
    found = {r["order_key"]: (tuple(r["lines"]), r["expected_total"]) for r in rows}
    assert len(found) == len(sample.expected) == 1500
    for key, expected in sample.expected.items():
        lines, total = found[key]
        assert lines == expected.lines, key
        assert total == expected.total, key  # Decimal equality: 12.3400000000 == 12.34


def test_fixture_is_clean_for_the_python_oracle(clean: Scenario, sample: TpchSample,
                                                order_keys: list[int]) -> None:
    world = clean.world
    chosen = replace(sample, expected={k: sample.expected[k] for k in order_keys})
    result = check_oracle(chosen, {str(k): o for k, o in world.orders.items()},
                          {str(k): b for k, b in world.ledgers.items()},
                          {str(k): a for k, a in world.accounts.items()},
                          list(world.invoices), data.CREDIT_LIMIT)
    assert result.violations == []
    assert result.confirmed > 0
    assert result.rejected > 0


def _environment(monkeypatch: pytest.MonkeyPatch, scenario: Scenario, moto: str) -> None:
    for name, value in {"EO_PROFILE": "local", "EO_DATABASE_DSN": scenario.dsn,
                        "EO_S3_ENDPOINT_URL": moto, "EO_S3_BUCKET": scenario.bucket,
                        "EO_S3_ACCESS_KEY": "test", "EO_S3_SECRET_KEY": "test"}.items():
        monkeypatch.setenv(name, value)


def test_a_clean_run_reports_nothing_and_exits_0(
        spark: SparkSession, clean: Scenario, moto: str, input_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _environment(monkeypatch, clean, moto)
    # a password in the DSN's query string (trust auth ignores it) must not be written down
    monkeypatch.setenv("EO_DATABASE_DSN", f"{clean.dsn}?password=hunter2")
    out = tmp_path / "audit"
    result = CliRunner().invoke(pipeline_app, [
        "audit", "--input", str(input_dir), "--output", str(out), "--older-than", "0",
        "--no-dead-letters", "--partitions", "2", "--list-splits", "8"])
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output
    assert "hunter2" not in (out / "summary.json").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["database"].endswith("?password=***")
    assert summary["counts"] == dict.fromkeys((*TpchAudit.names, *FINDINGS), 0)
    assert summary["violations"] == 0
    assert summary["prefixes"] == ["invoices"]  # the orders' declared blob prefix
    stages = {s["name"]: s for s in summary["stages"]}
    assert stages["list the bucket"]["rows"] == len(clean.world.invoices) == ORDERS
    assert read_rows(out / "orders") == []
    assert "**PASS**: no violation" in (out / "report.md").read_text()


@dataclass
class Audited:
    """An `eo pipeline audit` run: its exit code, what it printed, its output directory."""

    exit_code: int
    output: str
    out: Path


@pytest.fixture(scope="module")
def injected_audit(injected: Scenario, moto: str, input_dir: Path, spark: SparkSession,
                   tmp_path_factory: pytest.TempPathFactory) -> Audited:
    """The injected scenario audited once, in this process's shared `local[2]` session:
    what test_each_injected_violation_is_reported_and_exits_1 checks and what the audit on
    a standalone cluster must equal."""
    out = tmp_path_factory.mktemp("injected-audit") / "audit"
    with pytest.MonkeyPatch.context() as monkeypatch:
        _environment(monkeypatch, injected, moto)
        # threshold 0: everything before now counts (the young token is stamped in the future)
        result = CliRunner().invoke(pipeline_app, [
            "audit", "--input", str(input_dir), "--output", str(out), "--older-than", "0",
            "--no-dead-letters", "--partitions", "2", "--list-splits", "8"])
    return Audited(result.exit_code, result.output, out)


def test_each_injected_violation_is_reported_and_exits_1(injected: Scenario,
                                                         injected_audit: Audited) -> None:
    marks = injected.injected
    out = injected_audit.out
    assert injected_audit.exit_code == 1, injected_audit.output
    assert "FAIL: 10 violation(s)" in injected_audit.output

    orders = {(r["order_key"], r["problem"]): r for r in read_rows(out / "orders")}
    assert set(orders) == {(marks["doubled_line"], "doubled line"),
                           (marks["wrong_total"], "wrong total"),
                           (marks["missing_line"], "missing line")}
    assert orders[(marks["missing_line"], "missing line")]["line_numbers"] == [
        data.last_line_number(injected.world, marks["missing_line"])]
    doubled = injected.world.orders[marks["doubled_line"]].lines[0].line_number
    assert orders[(marks["doubled_line"], "doubled line")]["line_numbers"] == [doubled]
    wrong = orders[(marks["wrong_total"], "wrong total")]
    assert wrong["found_total"] - wrong["expected_total"] == Decimal("0.01")
    assert [(r["order_key"], r["problem"], r["ledger_confirmed"])
            for r in read_rows(out / "outcomes")] == [(marks["twice"], "not recorded once", 2)]
    # the doubled confirmation inflates the ledger revenue, the wrong total the confirmed sum
    wrong_customer = injected.world.orders[marks["wrong_total"]].customer_key
    assert {(r["customer_key"], r["problem"]) for r in read_rows(out / "customers")} == {
        (marks["twice_customer"], "debits, confirmations and ledger disagree"),
        (wrong_customer, "debits, confirmations and ledger disagree")}
    assert [r["key"] for r in read_rows(out / "orphans")] == [marks["orphan"]]
    assert [r["key"] for r in read_rows(out / "missing_objects")] == [marks["lost_invoice"]]
    assert [r["message_id"] for r in read_rows(out / "stale_tokens")] == [
        str(marks["stale_token"])]
    assert [(r["endpoint"], r["partition_key"]) for r in read_rows(out / "stale_transactions")
            ] == [("orders", str(marks["stale_transaction"]))]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"] == {"orders": 3, "outcomes": 1, "customers": 2, "orphans": 1,
                                 "missing_objects": 1, "stale_tokens": 1,
                                 "dead_letter_tokens": 0, "stale_transactions": 1}
    assert summary["violations"] == 10
    assert summary["bucket"] == injected.bucket
    report = (out / "report.md").read_text()
    assert "**FAIL**: 10 violation(s)" in report
    assert "![violation counts](counts.png)" in report
    assert "order states that differ from the oracle" in report  # the sample's own words
    assert "artifact keys named by committed states" in report   # the framework's
    assert marks["orphan"] in report
    assert (out / "counts.png").read_bytes().startswith(b"\x89PNG")


def test_dead_letters_count_as_violations(tmp_path: Path) -> None:
    result = AuditResult(dict.fromkeys(FINDINGS, 0), {"orders": 2, "ledger": None}, [], {},
                         tmp_path, REAL_NOW)
    assert result.violations == 2
    clean = AuditResult(dict.fromkeys(FINDINGS, 0), {"orders": 0}, [], {}, tmp_path, REAL_NOW)
    assert clean.violations == 0


def _invoice_key() -> str:
    """An invoice key as the orders handler makes one (`Context.artifact_key`)."""
    return Context(uuid.uuid4(), uuid.uuid4(), REAL_NOW).artifact_key("invoices")


def test_only_the_services_own_keys_can_be_orphans(spark: SparkSession) -> None:
    cutoff = datetime(2026, 1, 1, tzinfo=UTC)
    old = cutoff - timedelta(days=1)
    ours = _invoice_key()
    listing = spark.createDataFrame(
        [(ours, 1, old), ("reports/x.csv", 1, old), (f"invoices/{uuid.uuid4()}", 1, old),
         (f"receipts/{ours.split('/')[1]}", 1, old)],
        "key string, size long, last_modified timestamp")
    named = spark.createDataFrame([], "key string")
    found = orphan_objects(listing, named, cutoff, ("invoices",)).collect()
    assert [r["key"] for r in found] == [ours]


def test_orphans_younger_than_the_threshold_are_not_reported(spark: SparkSession) -> None:
    cutoff = datetime(2026, 1, 1, tzinfo=UTC)
    listing = spark.createDataFrame(
        [("a", 1, cutoff - timedelta(seconds=1)), ("b", 1, cutoff), ("c", 1, cutoff),
         ("d", 1, cutoff - timedelta(days=1))], "key string, size long, last_modified timestamp")
    named = spark.createDataFrame([("d",)], "key string")
    assert [r["key"] for r in orphan_objects(listing, named, cutoff).collect()] == ["a"]


@pytest.mark.parametrize(("args", "env", "named"), [
    (["--input", "{missing}"], {}, "not a directory"),
    (["--input", "{empty}"], {}, "no orders.parquet or orders.csv"),
    (["--input", "{input}", "--jdbc-jar", "{missing}/postgresql.jar"], {}, "--jdbc-jar"),
    (["--input", "{input}"], {"EO_DATABASE_DSN": "postgresql://postgres@127.0.0.1:1/x"},
     "check EO_DATABASE_DSN"),
    (["--input", "{input}"], {"EO_S3_ENDPOINT_URL": ""}, "EO_S3_ENDPOINT_URL is not set"),
])
def test_bad_input_or_settings_exit_2_naming_the_cause(
        args: list[str], env: dict[str, str], named: str, input_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_PROFILE", "local")
    monkeypatch.setenv("EO_S3_ENDPOINT_URL", "http://127.0.0.1:1")
    for name, value in env.items():
        if value:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name)
    (tmp_path / "empty").mkdir()
    where = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "input": input_dir}
    result = CliRunner().invoke(pipeline_app, [
        "audit", *(a.format(**where) for a in args), "--output", str(tmp_path / "out"),
        "--no-dead-letters"])
    assert result.exit_code == 2, result.output
    assert named in " ".join(result.output.split())


def test_every_order_problem_is_named(spark: SparkSession) -> None:
    items = spark.createDataFrame(
        [(1, 1, "1.00", "0.00", "0.00", "N"), (1, 2, "2.00", "0.00", "0.00", "R"),
         (2, 1, "1.00", "0.00", "0.00", "N"), (3, 1, "1.00", "0.00", "0.00", "N"),
         (4, 1, "1.00", "0.00", "0.00", "N"), (5, 1, "1.00", "0.10", "0.10", "N")],
        "l_orderkey bigint, l_linenumber bigint, l_extendedprice string, l_discount string, "
        "l_tax string, l_returnflag string",
    ).selectExpr("l_orderkey", "l_linenumber", *(f"CAST({c} AS decimal(15,2)) AS {c}" for c in
                                                 ("l_extendedprice", "l_discount", "l_tax")),
                 "l_returnflag")
    raw = spark.createDataFrame(
        [("1", 1, 9, "confirmed", "1.00", "invoices/1", [1, 2]),      # a removed line kept
         ("2", None, None, None, None, None, []),                     # no order key: garbage
         ("4", 4, 9, "awaiting_payment", "1.00", None, [1]),          # neither settled nor billed
         ("5", 5, 9, "rejected", "0.99", "invoices/5", [1]),          # 1 * 0.9 * 1.1 = 0.99
         ("6", 6, 9, "confirmed", "0.00", "invoices/6", [])],         # not in the input
        "partition_key string, order_key bigint, customer_key bigint, status string, "
        "total string, invoice_key string, line_numbers array<bigint>")
    found = {(r["order_key"], r["problem"], tuple(r["line_numbers"]))
             for r in order_findings(typed_orders(raw), items).collect()}
    assert found == {(1, "unexpected line", (2,)), (2, "unreadable state", ()),
                     (3, "missing order", ()), (4, "not settled", ()), (4, "no invoice", ()),
                     (6, "unexpected order", ())}


async def _ledger_stream_rows(dsn: str) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO eo_state_entry (endpoint, partition_key, version, message_id, state) "
            "VALUES ('ledger', '77', 1, $1, '{\"customer_key\": 77, \"revenue\": \"1.00\", "
            "\"confirmed\": [5], \"rejected\": []}'), ('ledger', '77', 2, $2, "
            "'{\"customer_key\": 77, \"revenue\": \"3.00\", \"confirmed\": [5, 6], "
            "\"rejected\": [7]}')", uuid.uuid4(), uuid.uuid4())
        return list(await conn.fetch(ledgers_query(stream=True)))
    finally:
        await conn.execute("DELETE FROM eo_state_entry WHERE endpoint = 'ledger'")
        await conn.close()


def test_a_ledger_on_the_state_strategy_is_read_from_its_newest_entry(clean: Scenario) -> None:
    rows = asyncio.run(_ledger_stream_rows(clean.dsn))
    assert [(r["customer_key"], r["revenue"], r["confirmed"], r["rejected"]) for r in rows] == [
        (77, "3.00", [5, 6], [7])]


def _findings(out: Path) -> dict[str, list[str]]:
    """Each finding's rows, as sorted JSON lines."""
    return {name: sorted(json.dumps(r, sort_keys=True, default=str)
                         for r in read_rows(out / name)) for name in (*TpchAudit.names, *FINDINGS)}


def test_on_a_standalone_cluster_from_another_directory_the_audit_equals_local(
        injected: Scenario, injected_audit: Audited, moto: str, input_dir: Path,
        tmp_path: Path, spark_cluster: str) -> None:
    """The injected scenario audited by `eo` started outside the project, on the cluster
    (the listing's tasks need the project's code): the same findings as the audit in this
    process's `local[2]` session (`injected_audit`)."""
    env = {"EO_PROFILE": "local", "EO_DATABASE_DSN": injected.dsn, "EO_S3_ENDPOINT_URL": moto,
           "EO_S3_BUCKET": injected.bucket, "EO_S3_ACCESS_KEY": "test",
           "EO_S3_SECRET_KEY": "test"}
    out = tmp_path / "cluster"
    result = eo_elsewhere(tmp_path, [
        "pipeline", "audit", "--input", str(input_dir), "--output", str(out),
        "--older-than", "0", "--no-dead-letters", "--partitions", "2",
        "--list-splits", "8", "--master", spark_cluster], env)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert "FAIL: 10 violation(s)" in result.stdout
    assert injected_audit.exit_code == 1, injected_audit.output
    local = _findings(injected_audit.out)
    assert _findings(out) == local
    assert {name: len(rows) for name, rows in local.items()} == {
        "orders": 3, "outcomes": 1, "customers": 2, "orphans": 1, "missing_objects": 1,
        "stale_tokens": 1, "dead_letter_tokens": 0, "stale_transactions": 1}
