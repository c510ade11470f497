"""The runs of `eo bench`: each path's consumer in processes of its own draining a preloaded
queue (throughput, CPU per message per process group), then the same consumers under a fixed
offered load (latency); the template's paths and the two references (tools/bench/references.py)
in the same run, interleaved round by round."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import random
import time
from dataclasses import replace
from typing import Any

from adapters.postgres.admin import database_name
from adapters.postgres.migrate import upgrade_async
from adapters.postgres.pool import create_pool
from adapters.postgres.token_store import PostgresTokenStore
from adapters.rabbitmq import topology
from adapters.rabbitmq.connection import RabbitConnection
from application.defaults import PREFETCH_IN_BATCHES
from tools.bench import references
from tools.bench.consumers import cpu_at, spawn_worker, stop_worker
from tools.bench.otlp_sink import SpanCount, otlp_sink
from tools.bench.report import BenchResult, Params, RunFigures, percentile_ms
from tools.bench.shapes import Shape
from tools.bench.tables import at_rest, truncate_tables
from tools.bench.traffic import GROUPS, Producer, Sink
from tools.bench.worker import RETRY_DELAYS_S, TEMPLATE_PATHS
from tools.scratch import fresh_name, own_database, own_vhost

PATHS = ("token", "token-batched", "outbox", "state", "minimal", "minimal-batched",
         "faststream", "dbos", "traced-token", "traced-token-batched")
#: The bench's database is `<the name --database-dsn gives, else this>_<pid>_<hex>`.
BENCH_DATABASE = "eo_bench"
#: Its virtual host (on a broker this host administers) is `<this>-<pid>-<hex>`.
BENCH_VHOST = "eo-bench"


async def run_bench(params: Params, on_run: Any = None, spawn: Any = None) -> BenchResult:
    """Run every (path, processes) of `params`, `params.rounds` times, interleaved;
    `on_run(figures)` after each run. `spawn(config)` starts a consumer process (default
    `spawn_worker`; `tools.bench.instructions` runs it under callgrind).

    Each run empties the tables, so the bench works on stores of its own
    (tools/scratch.py), removed at the end: a database `<name>_<pid>_<hex>` created on
    the server of `params.database_dsn` (`<name>`: the database that DSN names, never
    touched), a virtual host `eo-bench-<pid>-<hex>` when this host administers the broker
    (else the URL's own), and queues `<prefix>-<pid>-<hex>-<path>-<processes>` that no one
    else has. Raises what the services raise when they are unreachable or refuse (e.g. a
    role that may not create databases)."""
    prefix = database_name(params.database_dsn) or BENCH_DATABASE
    async with own_database(params.database_dsn, prefix) as dsn, \
            own_vhost(params.amqp_url, BENCH_VHOST, (), RETRY_DELAYS_S, "eo bench") as broker:
        own = replace(params, database_dsn=dsn, amqp_url=broker.url,
                      prefix=fresh_name(params.prefix, "-"))
        with contextlib.ExitStack() as stack:
            spans = None
            if any(_traced(path) for path, _ in params.runs):
                url, spans = stack.enter_context(otlp_sink())
                own = replace(own, otlp_endpoint=url)
            machine, runs = await _rounds(own, on_run, spawn or spawn_worker, spans)
    return BenchResult(params, machine, runs)


def _traced(path: str) -> bool:
    return path in TEMPLATE_PATHS and TEMPLATE_PATHS[path][2]


async def _rounds(params: Params, on_run: Any, spawn: Any, spans: SpanCount | None = None
                  ) -> tuple[dict[str, str], list[RunFigures]]:
    """The machine's description and every run's figures, on the stores `params` name (the
    bench's own: `run_bench`)."""
    await upgrade_async(params.database_dsn)
    admin = await create_pool(params.database_dsn, max_size=4)  # producer, checks
    driver = RabbitConnection(params.amqp_url)
    try:
        await driver.start()
        for statement in references.SCHEMA:
            await admin.execute(statement)
        underlay = await driver.channel.get_underlay_channel()
        machine = {"nproc": str(os.cpu_count()), "python": platform.python_version(),
                   "postgresql": str(await admin.fetchval("SHOW server_version")),
                   "rabbitmq": str(underlay.connection.server_properties.get("version", "?"))}
        runs = []
        for round_no in range(1, params.rounds + 1):
            for shape in params.shapes:
                for path, processes in params.runs:
                    figures = await _run(params, path, processes, round_no, admin, driver,
                                         spawn, spans, shape)
                    runs.append(figures)
                    if on_run is not None:
                        on_run(figures)
    finally:
        await driver.close()
        await admin.close()
    return machine, runs


async def _declare(driver: RabbitConnection, work: str, sink: str) -> None:
    """Declare a run's work and sink queues (names of the run's own: none exists yet)."""
    await topology.declare(driver, work, RETRY_DELAYS_S, delivery_limit=20)
    await topology.declare(driver, sink, (), delivery_limit=20)


async def _delete(driver: RabbitConnection, work: str, sink: str) -> None:
    """Delete the queues `_declare` declared, messages included."""
    names = topology.queue_names(work, RETRY_DELAYS_S)
    for name in (names.work, *names.retries, names.dead_letter, sink, f"{sink}.dlq"):
        await driver.channel.queue_delete(name)


async def _run(params: Params, path: str, processes: int, round_no: int, admin: Any,
               driver: RabbitConnection, spawn: Any, spans: SpanCount | None,
               shape: Shape) -> RunFigures:
    """One run under `shape`, on queues declared for it and deleted after it (also when it
    fails: on a virtual host the bench shares, nothing of its own is left behind). `spans`:
    the OTLP sink's count, for a traced path's `at_rest["spans_exported"]`."""
    work = f"{params.prefix}-{path}-{processes}"
    sink = f"{params.prefix}-sink-{path}-{processes}"
    await _declare(driver, work, sink)
    try:
        return await _measured(params, path, processes, round_no, admin, driver, spawn, work,
                               sink, spans, shape)
    finally:
        await _delete(driver, work, sink)


async def _measured(params: Params, path: str, processes: int, round_no: int, admin: Any,
                    driver: RabbitConnection, spawn: Any, work: str, sink: str,
                    spans: SpanCount | None, shape: Shape) -> RunFigures:
    label = path if processes == 1 else f"{path} x{processes}"
    spans_before = spans.total if spans is not None else 0
    n = shape.messages_for(params.messages)
    await truncate_tables(admin)
    token = TEMPLATE_PATHS.get(path, ("",))[0] == "token"
    producer = Producer(params, driver, PostgresTokenStore(admin), work, token,
                         random.Random(params.seed + round_no), shape)
    incoming = await producer.preload(n)
    receiver = Sink()
    receiver.expect(n)
    await receiver.start(driver, sink)
    batched = path.endswith("batched")
    in_flight = params.batch_size * PREFETCH_IN_BATCHES if batched else params.in_flight
    config = {"path": path, "work": work, "sink": sink, "database_dsn": params.database_dsn,
              "amqp_url": params.amqp_url, "in_flight": in_flight,
              "batch_size": params.batch_size, "batch_wait_s": params.batch_wait_ms / 1000,
              "otlp_endpoint": params.otlp_endpoint, "state_bytes": shape.state_bytes}
    procs: list[asyncio.subprocess.Process] = []
    reports: list[dict[str, Any]] = []
    try:
        for _ in range(processes):  # inside: a failed start stops those already started
            procs.append(await spawn(config))
        await _wait(receiver, procs, (60 + n * 0.05) * params.slowdown, label)
        first, last = receiver.first_ns, receiver.last_ns
        seconds = (last - first) / 1e9
        throughput = (n - 1) / seconds
        cpu = {g: (receiver.cpu_last[g] - receiver.cpu_first[g]) for g in GROUPS}
        offered = throughput * params.load_ratio
        count = max(50, min(params.latency_messages, int(offered * 5)))
        receiver.expect(count)
        incoming += await producer.paced(count, offered)
        await _wait(receiver, procs, (60 + count / offered * 2) * params.slowdown, label)
        latencies = receiver.latencies_ns
    finally:
        for proc in procs:
            reports.append(await stop_worker(proc, label))
        await receiver.stop()
    cpu["python"] = sum(cpu_at(r["samples"], last) - cpu_at(r["samples"], first)
                        for r in reports)
    rows = await at_rest(admin, path, work, incoming)
    if spans is not None and _traced(path):  # exported by the stop at the latest
        rows["spans_exported"] = spans.total - spans_before
    per_message = {g: cpu[g] * 1000 / (n - 1) for g in ("python", *GROUPS)}
    per_message["total"] = sum(per_message.values())
    round_trips = sum(r["round_trips"] for r in reports) / len(incoming)
    return RunFigures(label, path, processes, round_no, seconds, throughput, per_message,
                      offered, percentile_ms(latencies, 0.50), percentile_ms(latencies, 0.99),
                      round_trips, rows["dedup_rows"], rows, receiver.duplicates,
                      percentile_ms(producer.inserts_ns, 0.50),
                      percentile_ms(producer.inserts_ns, 0.99), shape.label,
                      sum(r.get("conflicts", 0) for r in reports) / len(incoming))


async def _wait(receiver: Sink, procs: list[asyncio.subprocess.Process], timeout_s: float,
                label: str) -> None:
    """Until the sink has its outputs; raises RuntimeError on a timeout or a dead consumer."""
    deadline = time.monotonic() + timeout_s
    while not receiver.done.is_set():
        if any(p.returncode is not None for p in procs):
            raise RuntimeError(f"{label}: a consumer process exited early")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{label}: {len(receiver.seen)} outputs of {receiver.target} "
                               f"in {timeout_s:.0f} s")
        try:
            await asyncio.wait_for(receiver.done.wait(), 0.2)
        except TimeoutError:
            continue
