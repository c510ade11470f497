"""`eo states` on PostgreSQL (issue 38: the user read `eo_transaction_record` with SQL): an
endpoint's states read through its store, the first `--limit` partitions by key or one
`--partition`, from the stream's newest entries on the `state` strategy, as a table or JSON;
an unknown endpoint or a bound out of range refused (exit 2), a database without the schema
named (exit 3), nothing written (the connection is read-only). On the counters service, in
a database of the test's own; the command runs in the test's process
(tests/support/in_process.py)."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator

import asyncpg
import pytest

from adapters.postgres.admin import drop_database, ensure_database, with_database
from adapters.postgres.pool import create_pool
from adapters.postgres.state_stream import PostgresStateStream
from adapters.system.clock import SystemClock
from entrypoints.local import postgres_stores
from tests.support.counters.endpoints import AuditLog, Reported, Tally
from tests.support.counters.registry import REGISTRY, SPEC
from tests.support.in_process import run_eo
from tests.support.processes import private_database, this_run
from tests.support.services import discover

#: 25 counters, c00 to c24, each with its own total
TALLIES = {f"c{i:02d}": Tally(total=i, applied=(f"m{i}",)) for i in range(25)}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    services = discover(rabbitmq=False)
    try:
        yield services.postgres_dsn
    finally:
        services.close()


async def _seed(dsn: str) -> None:
    pool = await create_pool(dsn, max_size=1)
    try:
        await postgres_stores(pool, SystemClock(), REGISTRY)["counter"].seed_states(TALLIES)
        stream = PostgresStateStream(pool, "audit", AuditLog, SystemClock())
        for version, total in enumerate((5, 8)):  # two entries: the newest is the state
            await stream.append("c01", version, uuid.uuid4(),
                                AuditLog((Reported("c01", 1, 200, total),)), {})
    finally:
        await pool.close()


@pytest.fixture(scope="module")
def dsn(server: str) -> Iterator[str]:
    with private_database(server, this_run("eo_states")) as dsn:
        asyncio.run(_seed(dsn))
        yield dsn


def _eo(dsn: str, *args: str, **env: str) -> tuple[int, str, str]:
    given = {k: v for k, v in os.environ.items() if not k.startswith("EO_")} | {
        "EO_SERVICE": SPEC, "EO_PROFILE": "local", "EO_DATABASE_DSN": dsn, "COLUMNS": "200",
        **env}
    done = run_eo(given, "states", *args)
    return done.returncode, done.stdout, done.stderr


def test_the_first_partitions_by_key_as_the_store_keeps_them(dsn: str) -> None:
    code, out, err = _eo(dsn, "counter", "--format", "json")
    assert code == 0, err
    page = json.loads(out)
    assert (page["endpoint"], page["strategy"], page["limit"], page["more"]) == (
        "counter", "token", 20, True)
    assert list(page["states"]) == [f"c{i:02d}" for i in range(20)]
    assert page["states"]["c07"] == {"total": 7, "applied": ["m7"], "receipts": [],
                                     "spent": [], "refused": []}
    code, out, err = _eo(dsn, "counter", "--format", "json", "--limit", "30")
    assert code == 0, err
    assert (len(json.loads(out)["states"]), json.loads(out)["more"]) == (25, False)


def test_one_partition_or_none(dsn: str) -> None:
    code, out, _ = _eo(dsn, "counter", "--partition", "c24", "--format", "json")
    assert code == 0
    assert json.loads(out)["states"] == {"c24": {"total": 24, "applied": ["m24"],
                                                 "receipts": [], "spent": [], "refused": []}}
    code, out, _ = _eo(dsn, "counter", "--partition", "nope", "--format", "json")
    assert (code, json.loads(out)["states"], json.loads(out)["more"]) == (0, {}, False)


def test_the_table_says_when_partitions_are_left_out(dsn: str) -> None:
    code, out, err = _eo(dsn, "counter", "--limit", "3")
    assert code == 0, err
    assert "counter: the first 3 partitions by key (more: --limit, --partition)" in out
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert rows == ["c00", "c01", "c02"]
    assert '{"total":1,"applied":["m1"]' in out


def test_a_state_endpoint_shows_its_streams_newest_entry(dsn: str) -> None:
    code, out, err = _eo(dsn, "audit", "--format", "json",
                         EO_STRATEGIES='{"audit": "state"}')
    assert code == 0, err
    page = json.loads(out)
    assert page["strategy"] == "state"
    assert page["states"] == {"c01": {"reports": [{"counter": "c01", "amount": 1, "status": 200,
                                                  "total": 8}]}}


@pytest.mark.parametrize("args", [["nope"], ["counter", "--limit", "0"],
                                  ["counter", "--limit", "1001"],
                                  ["counter", "--format", "yaml"]])
def test_an_unknown_endpoint_or_a_bad_option_exits_2(dsn: str, args: list[str]) -> None:
    code, out, err = _eo(dsn, *args)
    assert (code, out) == (2, "")
    if args == ["nope"]:
        assert "no endpoint 'nope'; the service has ['front', 'counter', 'audit', 'bank']" \
            in err


def test_a_database_without_the_schema_exits_3_saying_so(server: str) -> None:
    empty = with_database(server, this_run("eo_states_empty"))
    asyncio.run(ensure_database(empty))
    try:
        code, _, err = _eo(empty, "counter")
    finally:
        asyncio.run(drop_database(empty))
    assert code == 3
    assert "no eo_* tables: run `eo migrate`" in " ".join(err.split())


async def test_its_connection_cannot_write(dsn: str) -> None:
    pool = await create_pool(dsn, max_size=1, read_only=True)
    try:
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            await pool.execute("DELETE FROM eo_transaction_record")
    finally:
        await pool.close()
