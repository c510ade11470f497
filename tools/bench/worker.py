"""One consumer process of `eo bench`: `python -m tools.bench.worker '<json>'`.

It consumes the path's work queue until SIGTERM, sampling its own CPU time every 20 ms, then
prints one JSON line: the samples `[[monotonic_ns, cpu_s], ...]` (CLOCK_MONOTONIC is one
clock for every process of the machine, so the orchestrator cuts them at its own marks) and
the database round trips per statement (every path's pool is counted the same way). The
JSON argument: `path`, `work`, `sink`, `database_dsn`, `amqp_url`, `in_flight`,
`batch_size`, `batch_wait_s`, `state_bytes` (the load shape's state size, 0 for the small
balance) and `otlp_endpoint` for the traced paths. The report also counts the template
paths' commits refused by a conflict (`conflicts`: `transaction.conflict` events).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from adapters.postgres.pool import create_pool
from adapters.postgres.state_stream import PostgresStateStream
from adapters.postgres.token_store import PostgresTokenStore
from adapters.postgres.transactional_store import PostgresTransactionalStore
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.consumer import RabbitSource
from adapters.rabbitmq.dispatcher import RabbitDispatcher
from adapters.system.clock import SystemClock
from application.assembly import build_processor
from application.observability import TRANSACTION_CONFLICT, CountingSink
from application.ports import Ports
from application.ports.null_tracer import NULL_TRACER
from application.settlement import Settler
from application.strategy import Strategy
from entrypoints.tracing import tracing_from
from tools.bench import endpoint as bench
from tools.bench import references
from tools.bench.counting import CountingPool

RETRY_DELAYS_S = (0.05, 0.2, 1.0, 5.0)
#: the template's paths: strategy, whether the consumer batches, whether it traces (spans
#: exported over OTLP to the bench's sink, `config["otlp_endpoint"]`)
TEMPLATE_PATHS = {"token": ("token", False, False), "token-batched": ("token", True, False),
                  "outbox": ("outbox", False, False), "state": ("state", False, False),
                  "traced-token": ("token", False, True),
                  "traced-token-batched": ("token", True, True)}
REFERENCE_PATHS = ("minimal", "minimal-batched", "faststream", "dbos")


async def _template(config: dict[str, Any], pool: Any, rabbit: RabbitConnection,
                    events: CountingSink) -> None:
    strategy, batched, traced = TEMPLATE_PATHS[config["path"]]
    clock, state = SystemClock(), strategy == "state"
    tracing = None
    if traced:  # as a service configures it: OTLP over HTTP, the batch span processor
        os.environ.update({"OTEL_TRACES_EXPORTER": "otlp",
                           "OTEL_EXPORTER_OTLP_ENDPOINT": config["otlp_endpoint"]})
        tracing = tracing_from(f"bench-{config['path']}")
    work, sink = config["work"], config["sink"]
    # tokens in the endpoint database: protocol 3.2's co-located fast path, as the local
    # profile runs it when EO_TOKEN_DSN is unset
    ports = Ports(PostgresTokenStore(pool),
                  PostgresTransactionalStore(pool, work, bench.Balance, clock,
                                             holds_tokens=not state),
                  RabbitDispatcher(rabbit), clock, uuid.uuid4, events,
                  colocated_tokens=not state,
                  state_stream=PostgresStateStream(pool, work, bench.Balance, clock)
                  if state else None,
                  tracer=tracing.tracer if tracing else NULL_TRACER)
    processor = build_processor(bench.endpoint(work, sink, config.get("state_bytes", 0)),
                                ports, Strategy(strategy))
    consumer = Settler(processor, retry_delays=RETRY_DELAYS_S,
                       batch_size=config["batch_size"] if batched else 1,
                       batch_wait_s=config["batch_wait_s"])
    source = RabbitSource(rabbit, work, RETRY_DELAYS_S)
    try:
        await consumer.serve(source.deliveries(config["in_flight"]), config["in_flight"])
    finally:
        await source.stop()
        if tracing is not None:
            await asyncio.to_thread(tracing.close)


async def _main(config: dict[str, Any]) -> dict[str, Any]:
    samples: list[tuple[int, float]] = []

    async def sample() -> None:
        while True:
            samples.append((time.monotonic_ns(), time.process_time()))
            await asyncio.sleep(0.02)

    sampling = asyncio.create_task(sample())
    path = config["path"]
    pool = await create_pool(config["database_dsn"], max_size=config["in_flight"] + 2)
    counted = CountingPool(pool)
    rabbit = RabbitConnection(config["amqp_url"])
    await rabbit.start()
    events = CountingSink()
    state_bytes = config.get("state_bytes", 0)
    if path in TEMPLATE_PATHS:
        running = _template(config, counted, rabbit, events)
    elif path == "dbos":
        running = references.run_dbos(config["amqp_url"], config["database_dsn"],
                                      config["work"], config["sink"], config["in_flight"],
                                      state_bytes)
    elif path == "faststream":
        running = references.run_faststream(config["amqp_url"], counted, config["work"],
                                            config["sink"], config["in_flight"], state_bytes)
    else:
        running = references.run_minimal(config["amqp_url"], counted, config["work"],
                                         config["sink"], config["in_flight"],
                                         config["batch_size"] if path.endswith("batched")
                                         else 1, config["batch_wait_s"], state_bytes)
    task = asyncio.create_task(running)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(json.dumps({"ready": True}), flush=True)
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    failure = None
    if task.done() and task.exception() is not None:
        failure = f"{type(task.exception()).__name__}: {task.exception()}"
    samples.append((time.monotonic_ns(), time.process_time()))
    for pending in (task, sampling, waiter):
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pending
    await rabbit.close()
    await pool.close()
    counts = counted.counts
    return {"samples": samples, "round_trips": counts.total,
            "by_statement": dict(counts.by_statement), "failure": failure,
            "conflicts": events.total(TRANSACTION_CONFLICT)}


def main() -> None:
    """Run the consumer of `sys.argv[1]` (JSON, see the module docstring) until SIGTERM.
    With `EO_BENCH_PROFILE=<dir>` the process runs under cProfile and writes
    `<dir>/<path>-<pid>.prof` (for `python -m pstats`, snakeviz...)."""
    config = json.loads(sys.argv[1])
    profile_dir = os.environ.get("EO_BENCH_PROFILE")
    if not profile_dir:
        print(json.dumps(asyncio.run(_main(config))), flush=True)
        return
    import cProfile

    profiler = cProfile.Profile()
    report = profiler.runcall(asyncio.run, _main(config))
    Path(profile_dir).mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(Path(profile_dir) / f"{config['path']}-{os.getpid()}.prof")
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
