"""`eo bench` in miniature against PostgreSQL and RabbitMQ: the structure of its results and
the invariants that do not depend on timing. Benchmarks print figures; no speed is asserted."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from rich.console import Console

from adapters.postgres.admin import with_database
from tests.support.processes import this_run
from tests.support.services import Services, discover
from tools.bench.report import BenchResult, Params, as_json, print_table, write_json
from tools.bench.run import PATHS, run_bench

MESSAGES, PARTITIONS = 200, 50


@pytest.fixture(scope="module")
def services() -> Iterator[Services]:
    found = discover()
    yield found
    found.close()


@pytest.fixture
async def result(services: Services) -> AsyncIterator[BenchResult]:
    # a database of its own (the bench truncates its baseline table) and queues of its own
    dsn = with_database(services.postgres_dsn, this_run("eo_bench_test"))
    prefix = f"bench-test-{uuid.uuid4().hex[:8]}"
    yield await run_bench(Params(messages=MESSAGES, partitions=PARTITIONS, in_flight=8,
                                 database_dsn=dsn, amqp_url=services.amqp_url, prefix=prefix))
    conn = await asyncpg.connect(dsn)
    try:  # the bench deleted its queues and output tokens; drop its endpoints' rows too
        for table in ("eo_transaction_record", "eo_processed_message"):
            await conn.execute(f"DELETE FROM {table} WHERE endpoint LIKE $1", f"{prefix}-%")
    finally:
        await conn.close()


async def test_every_path_processes_every_message_and_leaves_what_it_should(
    result: BenchResult, tmp_path: Path
) -> None:
    paths = {p.path: p for p in result.paths}
    assert list(paths) == list(PATHS)
    for p in result.paths:
        assert p.at_rest["processed"] == MESSAGES, p.path  # the handler's count, summed
        assert p.settlements == {"processed": MESSAGES}, p.path
        assert p.at_rest["incoming_tokens_left"] == 0, p.path
        assert p.at_rest["side_effect_records_left"] == 0, p.path
        assert p.at_rest["unfinished_trs"] == 0, p.path
        assert p.round_trips_per_message > 0, p.path
        assert p.messages_per_s > 0, p.path  # a figure exists; its size is not tested
        assert 0 <= p.p50_ms <= p.p99_ms, p.path

    token, outbox, baseline = paths["token"], paths["outbox"], paths["baseline"]
    state = paths["state"]
    assert state.at_rest["stream_entries"] == MESSAGES  # one entry per message, at rest
    assert state.dedup_rows_at_rest == MESSAGES
    assert state.at_rest["incoming_tokens_left"] == 0
    assert state.at_rest["output_tokens"] == 0  # a state endpoint creates no token
    assert token.dedup_rows_at_rest == 0  # I9: nothing left behind by the token path
    assert outbox.at_rest["processed_message_rows"] == MESSAGES  # one per message, until purged
    assert outbox.dedup_rows_at_rest == MESSAGES
    assert baseline.dedup_rows_at_rest == 0
    # both protocol paths give every output a token for its receiver; the baseline none
    assert token.at_rest["output_tokens"] == outbox.at_rest["output_tokens"] == MESSAGES
    assert baseline.at_rest["output_tokens"] == 0
    # co-located fast path: token read, TR+state+token read, commit, clear; plus the first
    # message of each partition creating its TR
    assert 4 <= token.round_trips_per_message < 5

    out = tmp_path / "bench.json"
    write_json(result, out)
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(as_json(result)))
    assert written["parameters"]["messages"] == MESSAGES
    assert set(written["machine"]) == {"nproc", "python", "postgresql", "rabbitmq"}
    assert "database_dsn" not in written["parameters"]

    buffer = io.StringIO()
    print_table(result, Console(file=buffer, width=200))
    text = buffer.getvalue()
    assert "token path / baseline throughput =" in text
    for column in ("messages/s", "p50 ms", "p99 ms", "DB round trips/msg", "dedup rows at rest"):
        assert column in text


def test_the_bench_refuses_the_production_profile() -> None:
    from typer.testing import CliRunner

    from entrypoints.cli import app

    result = CliRunner().invoke(app, ["bench"], env={"EO_PROFILE": "production"})
    assert result.exit_code == 2, result.output
    assert "refuses the production profile" in " ".join(result.output.split())
