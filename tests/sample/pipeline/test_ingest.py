"""`eo pipeline ingest` against a real PostgreSQL: the Spark-derived commands equal the Python
producer's (`generate`), a re-run adds nothing, copies of input rows and of staged rows (what a
retried Spark task writes) are absorbed, and bad input exits 2 naming the option."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import pytest
from typer.testing import CliRunner

from adapters.postgres.admin import drop_database, ensure_database, with_database
from adapters.postgres.migrate import upgrade_async
from application.codec import encode
from entrypoints.cli import app
from tests.sample.pipeline.cluster import eo_elsewhere, spark_submit_elsewhere
from tests.support.processes import this_run
from tests.support.services import discover
from tools.pipeline.cli import pipeline_app
from tools.tpch.data import export_tables, generate
from tools.tpch.ingest import derive_commands, ingest, read_tables, table_paths

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SF = 0.001
DATABASE = this_run("eo_ingest_pipeline_test")
Command = tuple[str, str, bytes]


@pytest.fixture(scope="module")
def expected() -> set[Command]:
    """The Python producer's commands: (natural ID, type, body)."""
    return {(str(c.message_id), type(c.message).__name__, encode(c.message))
            for c in generate(SF).commands}


@pytest.fixture(scope="module")
def tpch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tpch")
    export_tables(SF, root / "parquet", "parquet")
    export_tables(SF, root / "csv", "csv")
    return {"parquet": root / "parquet", "csv": root / "csv"}


async def _recreate(dsn: str) -> None:
    await drop_database(dsn)
    await ensure_database(dsn)
    await upgrade_async(dsn)


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    services = discover(rabbitmq=False)
    database = with_database(services.postgres_dsn, DATABASE)
    asyncio.run(_recreate(database))
    yield database
    asyncio.run(drop_database(database))
    services.close()


async def _inbox(dsn: str, endpoint: str) -> tuple[list[Command], list[str]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT message_id, type, body FROM eo_inbox "
                                "WHERE endpoint = $1 AND relayed_at IS NULL", endpoint)
        staging = await conn.fetch("SELECT tablename FROM pg_tables "
                                   "WHERE tablename LIKE 'eo\\_inbox\\_stage\\_%'")
    finally:
        await conn.close()
    return ([(str(r["message_id"]), r["type"], bytes(r["body"])) for r in rows],
            [r["tablename"] for r in staging])


def test_csv_input_derives_exactly_the_python_producers_commands(
    spark: SparkSession, tpch: dict[str, Path], expected: set[Command],
) -> None:
    paths, fmt = table_paths(tpch["csv"])
    assert fmt == "csv"
    derived = [(r.message_id, r.type, bytes(r.body))
               for r in derive_commands(spark, *read_tables(spark, paths, fmt)).collect()]
    assert len(derived) == len(expected)
    assert set(derived) == expected


def test_ingest_twice_leaves_each_command_once(
    spark: SparkSession, tpch: dict[str, Path], expected: set[Command], dsn: str,
) -> None:
    first = ingest(spark, tpch["parquet"], dsn, endpoint="gateway")
    assert (first.staged, first.new) == (len(expected), len(expected))
    second = ingest(spark, tpch["parquet"], dsn, endpoint="gateway")
    assert (second.staged, second.new, second.already_present) == (
        len(expected), 0, len(expected))
    rows, staging = asyncio.run(_inbox(dsn, "gateway"))
    assert len(rows) == len(expected)
    assert set(rows) == expected  # IDs, types and bodies byte for byte
    assert staging == []  # every run dropped its staging table


def test_copies_of_input_rows_and_of_staged_rows_are_absorbed(
    spark: SparkSession, tpch: dict[str, Path], expected: set[Command], dsn: str,
    tmp_path: Path,
) -> None:
    # a producer that re-sent its files: every orders and lineitem row twice, in two parts
    paths, _ = table_paths(tpch["parquet"])
    for table, path in paths.items():
        frame = spark.read.parquet(str(path))
        frame.union(frame).repartition(2).write.parquet(str(tmp_path / f"{table}.parquet"))
    endpoint = f"gateway-copies-{uuid.uuid4().hex[:8]}"
    report = ingest(spark, tmp_path, dsn, endpoint=endpoint)
    # each copy is staged (as the rows of a retried task would be) and merged once
    assert (report.staged, report.new) == (2 * len(expected), len(expected))
    rows, _ = asyncio.run(_inbox(dsn, endpoint))
    assert set(rows) == expected
    assert len(rows) == len(expected)


@pytest.mark.parametrize(("args", "option", "words"), [
    (["--input", "{missing}"], "--input", "not a directory"),
    (["--input", "{empty}"], "--input", "orders.parquet and lineitem.parquet"),
    (["--input", "{only_orders}", "--format", "csv"], "--input", "lineitem.csv"),
    (["--input", "{empty}", "--format", "json"], "--format", "expected parquet or csv"),
])
def test_bad_input_exits_2_naming_the_option(
    tmp_path: Path, args: list[str], option: str, words: str,
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "only_orders").mkdir()
    (tmp_path / "only_orders" / "orders.csv").write_text("o_orderkey\n1\n")
    where = {name: str(tmp_path / name) for name in ("missing", "empty", "only_orders")}
    result = CliRunner().invoke(pipeline_app, ["ingest-tpch", *(a.format(**where) for a in args)])
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.replace("│", " ").split())
    assert f"Invalid value for {option}" in flat
    assert words in flat


def test_a_missing_jdbc_driver_exits_2_naming_the_option(tpch: dict[str, Path],
                                                        tmp_path: Path) -> None:
    result = CliRunner().invoke(pipeline_app, ["ingest-tpch", "--input", str(tpch["csv"]),
                                               "--jdbc-jar", str(tmp_path / "none.jar")])
    assert result.exit_code == 2, result.output
    assert "Invalid value for --jdbc-jar" in " ".join(result.output.replace("│", " ").split())


def test_a_missing_column_is_named(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "orders.csv").write_text("o_orderkey,o_custkey\n1,2\n")
    (tmp_path / "lineitem.csv").write_text("l_orderkey\n1\n")
    paths, fmt = table_paths(tmp_path)
    with pytest.raises(ValueError, match=r"orders\.csv: missing column\(s\) o_orderdate"):
        read_tables(spark, paths, fmt)


def test_demo_refuses_an_unknown_ingest_mode() -> None:
    result = CliRunner().invoke(app, ["demo", "--ingest", "kafka"])
    assert result.exit_code == 2, result.output
    assert "Invalid value for --ingest" in " ".join(result.output.replace("│", " ").split())


def test_an_unmigrated_database_exits_3_before_spark_starts(tpch: dict[str, Path]) -> None:
    services = discover(rabbitmq=False)
    bare = with_database(services.postgres_dsn, this_run("eo_ingest_unmigrated"))
    try:
        asyncio.run(ensure_database(bare))
        result = CliRunner().invoke(pipeline_app, ["ingest-tpch", "--input", str(tpch["csv"])],
                                    env={"EO_PROFILE": "local", "EO_DATABASE_DSN": bare})
        assert result.exit_code == 3, result.output
        assert "no eo_inbox table: run `eo migrate`" in " ".join(result.output.split())
    finally:
        asyncio.run(drop_database(bare))
        services.close()


def test_on_a_standalone_cluster_from_another_directory_the_ingest_equals_local(
    spark_cluster: str, tpch: dict[str, Path], expected: set[Command], tmp_path: Path,
) -> None:
    """`eo pipeline ingest --master spark://...` started outside the project: the same rows
    as `local[*]` gives (test_ingest_twice_leaves_each_command_once); a re-run, through
    `spark-submit entrypoints/cli.py` (whose folder then leads the path), adds none."""
    services = discover(rabbitmq=False)
    database = with_database(services.postgres_dsn, this_run("eo_ingest_cluster_test"))
    try:
        asyncio.run(_recreate(database))
        env = {"EO_PROFILE": "local", "EO_DATABASE_DSN": database,
               "EO_SPARK_MASTER": spark_cluster}
        args = ["pipeline", "ingest-tpch", "--input", str(tpch["parquet"])]
        first = eo_elsewhere(tmp_path, args, env)
        assert first.returncode == 0, first.stdout + first.stderr[-3000:]
        assert f"new in the gateway's inbox: {len(expected):,};" in " ".join(first.stdout.split())
        again = spark_submit_elsewhere(tmp_path, spark_cluster, args, env)
        assert again.returncode == 0, again.stdout + again.stderr[-3000:]
        assert "new in the gateway's inbox: 0;" in " ".join(again.stdout.split())
        rows, staging = asyncio.run(_inbox(database, "gateway"))
        assert len(rows) == len(expected)
        assert set(rows) == expected
        assert staging == []
    finally:
        asyncio.run(drop_database(database))
        services.close()


def test_an_executor_failure_is_reported_by_its_cause(
    spark_cluster: str, tpch: dict[str, Path], dsn: str, tmp_path: Path,
) -> None:
    """Executors that cannot start the Python named for them: exit 3 and the cause, not
    PySpark's "An exception was thrown from the Python worker" or a traceback."""
    result = eo_elsewhere(tmp_path, ["pipeline", "ingest-tpch", "--input", str(tpch["parquet"]),
                                     "--master", spark_cluster],
                          {"EO_PROFILE": "local", "EO_DATABASE_DSN": dsn,
                           "EO_SPARK_PYTHON": str(tmp_path / "no-python")})
    assert result.returncode == 3, result.stdout + result.stderr[-3000:]
    last = " ".join(result.stderr.strip().split("ingest failed in Spark:")[-1].split())
    assert last.startswith(f'Cannot run program "{tmp_path / "no-python"}"'), result.stderr
    assert "set EO_SPARK_PYTHON" in last
    assert "Traceback" not in result.stderr
