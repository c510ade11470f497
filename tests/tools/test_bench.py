"""`eo bench` in miniature against PostgreSQL and RabbitMQ: the structure of its results and
the invariants that do not depend on timing. Benchmarks print figures; no speed is asserted."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from adapters.postgres.admin import with_database
from tests.support.processes import this_run
from tests.support.services import Services, discover
from tests.support.users_stores import (
    MARKER,
    databases_like,
    queued,
    untouched_database,
    users_database,
    users_vhost,
    vhosts,
)
from tools.bench.consumers import spawn_worker
from tools.bench.report import BenchResult, Params, as_json, print_table, write_json
from tools.bench.run import PATHS, run_bench
from tools.bench.worker import TEMPLATE_PATHS

pytestmark = pytest.mark.slow(minutes=2)  # real processes, callgrind

MESSAGES, PARTITIONS = 200, 50
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def services() -> Iterator[Services]:
    found = discover()
    yield found
    found.close()


#: every path once (the unbatched traced one aside: the batched one shows the spans' export),
#: and a batched one on two processes
RUNS = (*((path, 1) for path in PATHS if path != "traced-token"), ("token-batched", 2))


@pytest.fixture
async def result(services: Services) -> BenchResult:
    # the bench makes its database and queues, and removes them
    dsn = with_database(services.postgres_dsn, this_run("eo_bench_test"))
    return await run_bench(Params(messages=MESSAGES, partitions=PARTITIONS, in_flight=8,
                                 batch_size=10, database_dsn=dsn, amqp_url=services.amqp_url,
                                 latency_messages=60, runs=RUNS,
                                 batch_wait_ms=2))  # batches also wait to fill


async def test_every_path_processes_every_message_and_leaves_what_it_should(
    result: BenchResult, tmp_path: Path
) -> None:
    runs = {r.label: r for r in result.runs}
    assert list(runs) == [p if n == 1 else f"{p} x{n}" for p, n in RUNS]
    for r in result.runs:
        # the drain's messages and the latency phase's, each counted once by the handler
        handled = r.at_rest["processed"]
        assert handled > MESSAGES, r.label
        assert r.at_rest["side_effect_records_left"] == 0, r.label
        assert r.at_rest["unfinished_trs"] == 0, r.label
        assert r.at_rest["outbox_rows_left"] == 0, r.label
        assert r.messages_per_s > 0, r.label  # a figure exists; its size is not tested
        assert r.offered_per_s == pytest.approx(r.messages_per_s * 0.5)
        assert 0 <= r.p50_ms <= r.p99_ms, r.label
        assert r.cpu_ms["python"] > 0, r.label  # the consumer processes were measured
        assert r.cpu_ms["total"] == pytest.approx(sum(
            r.cpu_ms[g] for g in ("python", "postgresql", "rabbitmq")))
        if r.path != "dbos":  # its statements go through SQLAlchemy: not counted
            assert r.round_trips_per_message > 0, r.label
        if TEMPLATE_PATHS.get(r.path, ("",))[0] == "token":
            assert r.dedup_rows_at_rest == 0, r.label  # I9: nothing left behind
            assert r.at_rest["output_tokens"] == handled, r.label  # one per output
        else:  # one row per message: processed-message rows, stream entries, inbox rows
            assert r.dedup_rows_at_rest == handled, r.label
    traced = runs["traced-token-batched"]  # a span per message at least, and the batches'
    assert traced.at_rest["spans_exported"] > traced.at_rest["processed"]
    assert "spans_exported" not in runs["token"].at_rest
    # the batched path costs fewer round trips than the unbatched one, in every run
    assert runs["token-batched"].round_trips_per_message < runs["token"].round_trips_per_message

    summaries = {s.label: s for s in result.summaries()}
    assert set(summaries["token"].ratios) == {"minimal", "minimal-batched", "faststream",
                                              "dbos"}
    assert summaries["token"].ratios["minimal"] == pytest.approx(
        summaries["token"].messages_per_s[1] / summaries["minimal"].messages_per_s[1])
    assert summaries["token-batched x2"].ratios == {}  # no reference ran on 2 processes

    out = tmp_path / "bench.json"
    write_json(result, out)
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(as_json(result)))
    assert written["parameters"]["messages"] == MESSAGES
    assert written["parameters"]["batch_wait_ms"] == 2
    assert set(written["machine"]) == {"nproc", "python", "postgresql", "rabbitmq"}
    assert "database_dsn" not in written["parameters"]
    assert len(written["runs"]) == len(RUNS)

    buffer = io.StringIO()
    print_table(result, Console(file=buffer, width=250))
    text = buffer.getvalue()
    for column in ("msg/s min", "median", "CPU ms/msg", "Python", "PG", "RabbitMQ", "p50 ms",
                   "dedup rows", "/ minimal", "/ faststream", "/ dbos"):
        assert column in text


async def test_a_consumer_that_does_not_start_in_time_is_killed_not_left_consuming() -> None:
    """A prefix that keeps the process alive without its ready line: after the timeout no
    child of this process is left (an orphaned consumer would drain the next runs' queues)."""
    before = {p.pid for p in psutil.Process().children()}
    stalled = (sys.executable, "-c", "import time; time.sleep(60)")
    with pytest.raises(TimeoutError):
        await spawn_worker({"path": "token"}, stalled, start_timeout_s=0.5)
    assert {p.pid for p in psutil.Process().children()} - before == set()


def test_the_bench_refuses_the_production_profile() -> None:
    from typer.testing import CliRunner

    from entrypoints.cli import app

    result = CliRunner().invoke(app, ["bench"], env={"EO_PROFILE": "production"})
    assert result.exit_code == 2, result.output
    assert "refuses the production profile" in " ".join(result.output.split())


async def test_the_bench_leaves_a_users_database_and_queues_alone(services: Services) -> None:
    """The bench once migrated, and emptied the tables of, the database `--database-dsn`
    names, and deleted the queues of its prefix wherever the AMQP URL pointed (issue 24). It
    now creates a database of its own on that server (the name as a prefix) and queues of
    its own, and removes them: the user's database and queue under those very names survive,
    and nothing of the run is left."""
    name = this_run("eo_bench_user")
    prefix = f"bench-user-{uuid.uuid4().hex[:8]}"
    queue = f"{prefix}-token-1"  # the work queue the bench once deleted, then declared
    async with users_database(services.postgres_dsn, name) as dsn, \
            users_vhost(services.amqp_url, this_run("eo-bench-user", "-"), queue) as url:
        result = await run_bench(Params(messages=20, partitions=5, database_dsn=dsn,
                                        amqp_url=url, prefix=prefix, latency_messages=50,
                                        runs=(("token", 1),)))
        assert (await untouched_database(dsn), await queued(url, queue)) == (
            (["user_marker"], [MARKER]), 1)
        assert result.runs[0].at_rest["processed"] > 20
        assert await databases_like(dsn, name) == []
        assert [v for v in vhosts() if v.startswith(f"eo-bench-{os.getpid()}-")] == []


async def test_each_shape_has_every_run_its_state_size_and_ratios_of_its_own(
    services: Services
) -> None:
    """`--shapes zipf:1.2@1k,one` with the batched token path and its reference on two
    processes each: every run under each shape, each deposit counted once by the handler
    (on one account two processes of the token path conflict and retry: counted, never
    asserted), the stored states as big as the shape says, and each ratio taken against
    the reference under the same shape."""
    from tools.bench.shapes import parse

    dsn = with_database(services.postgres_dsn, this_run("eo_bench_test"))
    runs = (("token-batched", 2), ("minimal-batched", 2))
    result = await run_bench(Params(messages=40, partitions=5, in_flight=8, batch_size=10,
                                    database_dsn=dsn, amqp_url=services.amqp_url,
                                    latency_messages=50, runs=runs,
                                    shapes=(parse("zipf:1.2@1k"), parse("one"))))
    assert [(r.shape, r.label) for r in result.runs] == [
        (shape, label) for shape in ("zipf:1.2@1k", "one")
        for label in ("token-batched x2", "minimal-batched x2")]
    for r in result.runs:
        assert r.at_rest["processed"] == 40 + 50, (r.shape, r.label)  # drained + paced
        assert r.at_rest["side_effect_records_left"] == r.at_rest["unfinished_trs"] == 0
        assert r.conflicts_per_message >= 0
        if r.shape == "one":
            assert r.at_rest["state_bytes"] < 100, r.label  # the small balance
        else:  # about 1 KiB of JSON; PostgreSQL's text of jsonb adds a space per item
            assert 900 <= r.at_rest["state_bytes"] <= 1400, (r.label, r.at_rest)
        if r.path == "minimal-batched":
            assert r.conflicts_per_message == 0  # it locks the account's row instead
    summaries = {(s.shape, s.label): s for s in result.summaries()}
    for shape in ("zipf:1.2@1k", "one"):
        mine = summaries[(shape, "token-batched x2")]
        theirs = summaries[(shape, "minimal-batched x2")]
        assert mine.ratios["minimal-batched"] == pytest.approx(
            mine.messages_per_s[1] / theirs.messages_per_s[1])
    out = io.StringIO()
    print_table(result, Console(file=out, width=250))
    assert "zipf:1.2@1k" in out.getvalue()
    assert "conflicts/msg" in out.getvalue()


async def test_a_bench_stopped_by_sigterm_removes_its_database_vhost_and_consumers(
    services: Services
) -> None:
    """SIGTERM (`timeout`, `kill`, a CI runner) ended `eo bench` where it stood: its
    database, its virtual host and its consumer processes stayed behind. Now SIGTERM
    cancels the run as Ctrl-C does, its clean-ups run, and it exits 143."""
    import asyncio
    import signal
    import time

    name = this_run("eo_bench_term")
    dsn = with_database(services.postgres_dsn, name)
    bench = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from entrypoints.cli import main; main()", "bench",
        "--messages", "20000", "--runs", "token", "--database-dsn", dsn,
        "--amqp-url", services.amqp_url, "--json", os.devnull,
        cwd=ROOT, env={**os.environ, "EO_PROFILE": "local"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    mark = f'"work": "bench-{bench.pid}-'  # its queues' prefix, in its consumers' arguments

    def consumers() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"])
                if mark in " ".join(p.info["cmdline"] or ())]

    try:
        deadline = time.monotonic() + 90
        while not consumers():  # its database made, the queue preloaded, a consumer up
            assert bench.returncode is None, await bench.communicate()
            assert time.monotonic() < deadline, "no consumer started"
            await asyncio.sleep(0.2)
        assert await databases_like(dsn, name) != []
        bench.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(bench.communicate(), 60)
    finally:
        if bench.returncode is None:
            bench.kill()
            await bench.wait()
    assert bench.returncode == 128 + signal.SIGTERM, (out, err)
    assert b"stopped by SIGTERM" in err
    assert await databases_like(dsn, name) == []
    assert [v for v in vhosts() if v.startswith(f"eo-bench-{bench.pid}-")] == []
    assert consumers() == []


async def test_the_statements_bench_processes_every_message_once_per_configuration(
    services: Services
) -> None:
    """`python -m tools.bench.statements`: each configuration's statements process every
    deposit once (the tool checks it, and raises otherwise) and the figures are the server's
    CPU per message per step, never negative. No speed is asserted."""
    from tools.bench.statements import measure

    dsn = with_database(services.postgres_dsn, this_run("eo_bench_test"))
    results = await measure(dsn, messages=90, partitions=20, batch_size=10)
    assert list(results) == ["token", "token-batched", "minimal", "minimal-batched"]
    for label in ("token", "token-batched"):
        assert set(results[label]) == {"load", "commit", "clear", "total"}, label
    assert all(v >= 0 for figures in results.values() for v in figures.values())
    assert all(figures["total"] == pytest.approx(sum(v for k, v in figures.items()
                                                     if k != "total"))
               for figures in results.values())


def test_a_callgrind_total_is_read_and_a_file_without_one_is_refused(tmp_path: Path) -> None:
    from tools.bench.instructions import callgrind_total

    done, cut = tmp_path / "done.callgrind", tmp_path / "cut.callgrind"
    done.write_text("version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nfl=x\n1 5\n"
                    "totals: 123456\n")
    cut.write_text("version: 1\nevents: Ir\nfl=x\n1 5\n")
    assert callgrind_total(done) == 123456
    with pytest.raises(ValueError, match="no instruction total"):
        callgrind_total(cut)


@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("callgrind_control")
                    is None, reason="valgrind is not installed")
async def test_the_instructions_bench_counts_the_consumer_under_callgrind(
    services: Services, tmp_path: Path
) -> None:
    """`python -m tools.bench.instructions`: the consumer runs under callgrind, switched on
    once ready, and its count is divided by the messages it processed. No count is
    asserted beyond being one."""
    from tools.bench.instructions import callgrind_total, measure

    dsn = with_database(services.postgres_dsn, this_run("eo_bench_test"))
    prefix = f"bench-test-{uuid.uuid4().hex[:8]}"
    params = Params(messages=60, partitions=20, batch_size=10, database_dsn=dsn,
                    amqp_url=services.amqp_url, prefix=prefix, latency_messages=50,
                    runs=(("token-batched", 1),))
    counts = await measure(params, tmp_path)
    total = callgrind_total(tmp_path / "token-batched.callgrind")
    assert list(counts) == ["token-batched"]
    assert counts["token-batched"] == pytest.approx(total / 110)  # 60 drained + 50 paced
    with pytest.raises(ValueError, match="one process per run"):
        await measure(replace(params, runs=(("token-batched", 2),)), tmp_path)
