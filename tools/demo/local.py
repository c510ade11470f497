"""`eo demo --profile local`: the demo through RabbitMQ, PostgreSQL, an S3 API (moto server)
and the payments callee over HTTP, with consumer processes, duplicates injected at the
broker, and one consumer killed and restarted."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import TypeVar

import asyncpg
from pydantic import SecretStr

from adapters.postgres.admin import database_name
from adapters.postgres.pool import create_pool
from adapters.rabbitmq import topology
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dispatcher import RabbitDispatcher
from adapters.s3.blob_store import S3BlobStore
from adapters.s3.moto_server import MotoServer
from adapters.system.clock import SystemClock
from application.codec import encode
from application.envelope import Envelope
from domain.sample.payments import open_account
from entrypoints.local import postgres_stores
from entrypoints.operations import migrate_all
from entrypoints.service_spec import Service
from entrypoints.settings import Settings
from tools.chaos.at_rest import at_rest, dead_letters, queue_depth
from tools.chaos.checks import audit_logs, read_logs
from tools.chaos.fleet import (
    Fleet,
    bucket_client,
    business_states,
    empty_bucket,
    final_sweep,
)
from tools.demo.run import GATEWAY, PAYMENTS, DemoReport
from tools.demo.spark_ingest import ingest_twice
from tools.scratch import own_database, own_vhost
from tools.settings import ToolSettings
from tools.tpch.data import TpchSample
from tools.tpch.oracle import check_oracle

#: Each run's database is `<this>_<pid>_<hex>`, on the server of `EO_DATABASE_DSN`.
DEMO_DATABASE = "eo_demo"
#: Each run's virtual host (on a broker this host administers) is `<this>-<pid>-<hex>`.
DEMO_VHOST = "eo-demo"
#: The demo's bucket on `EO_S3_ENDPOINT_URL` (emptied by each run): never `EO_S3_BUCKET`.
DEMO_BUCKET = "eo-demo"
S = TypeVar("S", bound=Settings)


def demo_settings(base: S, blob_dir: Path) -> S:
    """`base` pointed at the demo's own bucket (emptied by each run), whatever `EO_S3_BUCKET`
    says. Its database and virtual host are made by each run (`run_local_demo`) on the server
    and broker `base` names, never the ones it names."""
    return base.replaced(profile="local", token_dsn=None, s3_bucket=DEMO_BUCKET,
                         blob_dir=blob_dir)


async def run_local_demo(
    settings: ToolSettings,
    service: Service,
    sample: TpchSample,
    orders_consumers: int,
    duplicates: float,
    seed: int,
    log_dir: Path,
    on_progress: Callable[[int], None] = lambda _done: None,
    timeout_s: float = 900.0,
    ingest_dir: Path | None = None,
    keep_database: bool = False,
) -> DemoReport:
    """Run the sample through RabbitMQ, PostgreSQL, S3 (one moto server for every process)
    and HTTP (an `eo serve --endpoint payments` process) with consumer processes (one gateway,
    `orders_consumers` orders, one ledger), duplicates injected at the broker, one orders
    process killed with SIGKILL at a third of the way and restarted; then quiescence, a
    graceful stop, a final sweep and the oracle. Raises TimeoutError without quiescence.

    With `ingest_dir` (TPC-H tables of the sample's scale factor) the commands are not
    published to the gateway's queue: the Spark ingest writes them into the gateway's inbox,
    twice (the re-run adds nothing), and the gateway process relays them.

    The run's database and virtual host are its own (tools/scratch.py): a database
    `eo_demo_<pid>_<hex>` on the server of `settings.database()` (kept with `keep_database`,
    and named in the report's notes), a virtual host `eo-demo-<pid>-<hex>` when this host
    administers the broker, else the URL's own when it holds none of the endpoints' queues;
    all removed at the end. Raises `SettingsError` naming `EO_AMQP_URL` when that virtual
    host holds them (the run would delete them)."""
    started = time.monotonic()
    endpoints = service.registry.consuming()
    async with own_vhost(settings.amqp(), DEMO_VHOST, endpoints,
                         settings.protocol.retry_delays_s,
                         "eo demo") as broker, \
            own_database(settings.database(), DEMO_DATABASE, keep_database) as dsn:
        settings = settings.replaced(amqp_url=SecretStr(broker.url),
                                     database_dsn=SecretStr(dsn))
        moto = None
        if settings.blobs.s3_endpoint_url is None:  # one S3 API for every process (each would
            moto = MotoServer()                # otherwise start its own), gone after the run
            settings = settings.replaced(s3_endpoint_url=moto.start())
        if settings.blobs.s3_access_key is None or settings.blobs.s3_secret_key is None:
            settings = settings.replaced(s3_access_key=SecretStr("local"),
                                         s3_secret_key=SecretStr("local"))
        try:
            report = await _run(settings, service, sample, orders_consumers, duplicates, seed,
                                log_dir, on_progress, timeout_s, started, ingest_dir)
        finally:
            if moto is not None:
                moto.stop()
        if keep_database:
            report.notes.append(f"database {database_name(dsn)} kept (--keep-database): "
                                "drop it when done")
        return report


async def _run(settings: ToolSettings, service: Service, sample: TpchSample,
               orders_consumers: int, duplicates: float, seed: int, log_dir: Path,
               on_progress: Callable[[int], None], timeout_s: float, started: float,
               ingest_dir: Path | None = None) -> DemoReport:
    rng = random.Random(seed)
    await migrate_all(settings)  # the run's own database, new
    await empty_bucket(settings)
    pool = await create_pool(settings.database(), max_size=4)
    await open_accounts(pool, service, sample, settings.credit_limit)
    rabbit = RabbitConnection(settings.amqp())
    await rabbit.start()
    for endpoint in service.registry.consuming():
        await topology.declare(rabbit, endpoint, settings.protocol.retry_delays_s,
                               settings.rabbitmq.delivery_limit)
    fleet = Fleet(settings, log_dir, duplicates)
    fleet.start(PAYMENTS, PAYMENTS)
    await fleet.wait_for_callee(PAYMENTS)
    fleet.start("gateway", "gateway")
    fleet.start("ledger", "ledger")
    for i in range(orders_consumers):
        fleet.start(f"orders-{i}", "orders")
    notes: list[str] = []
    codes: dict[str, int | None] = {}
    try:
        if ingest_dir is None:
            injected = await publish_commands(rabbit, sample, duplicates, rng)
        else:  # the outside producer is the Spark job; its copies never reach the broker
            injected = 0
            notes.extend(await asyncio.to_thread(ingest_twice, settings, ingest_dir))
        killed, idle, last = False, 0, -1
        # quiescent: queues empty and no order settled for a while (3 s when all are
        # settled; 15 s otherwise, e.g. when dead letters keep orders from completing)
        while idle < (3 if last == len(sample.expected) else 15):
            await asyncio.sleep(1.0)
            done = await settled_orders(pool)
            on_progress(done)
            if not killed and done >= len(sample.expected) // 3:
                fleet.kill("orders-0")
                notes.append(f"orders-0 killed (SIGKILL) at {done} settled orders, restarted")
                fleet.start("orders-0", "orders")
                killed = True
            busy = await queue_depth(settings.amqp(), service.registry.consuming(),
                                     settings.protocol.retry_delays_s)
            busy += int(await pool.fetchval(  # inbox rows the gateway has yet to relay
                "SELECT count(*) FROM eo_inbox WHERE relayed_at IS NULL"))
            idle = idle + 1 if busy == 0 and done == last else 0
            last = done
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"no quiescence after {timeout_s} s")
        codes.update(fleet.stop_all(keep=(PAYMENTS,)))
        # the final sweep may still DELETE requests on the callee: payments stops after it
        await final_sweep(fleet.caller_settings(settings), service)
    finally:
        codes.update(fleet.stop_all())  # payments, and everyone after an error
        await rabbit.close()
    notes.append(f"exit codes after SIGTERM: {codes}")
    return await _report(settings, service, sample, pool, fleet, injected, notes,
                         time.monotonic() - started)


async def publish_commands(rabbit: RabbitConnection, sample: TpchSample, rate: float,
                           rng: random.Random) -> int:
    """Commands, shuffled, to the gateway; a share `rate` published twice at once (concurrent
    copies) or again at the end (a late re-send). Returns the copies injected."""
    dispatcher = RabbitDispatcher(rabbit)
    commands = list(sample.commands)
    rng.shuffle(commands)
    late: list[Envelope] = []
    injected = 0
    for start in range(0, len(commands), 200):
        batch = []
        for command in commands[start:start + 200]:
            env = Envelope(command.message_id, type(command.message).__name__,
                           encode(command.message))
            batch.append(env)
            draw = rng.random()
            if draw < rate / 2:
                batch.append(env)
                injected += 1
            elif draw < rate:
                late.append(env)
        await asyncio.gather(*(dispatcher.dispatch(GATEWAY, e) for e in batch))
    await asyncio.gather(*(dispatcher.dispatch(GATEWAY, e) for e in late))
    return injected + len(late)


async def settled_orders(pool: asyncpg.Pool) -> int:
    """Orders confirmed or rejected so far (orders is always a token endpoint; the ledger
    may keep its state in a stream)."""
    value = await pool.fetchval(
        "SELECT count(*) FROM eo_transaction_record WHERE endpoint = 'orders' "
        "AND state->>'status' IN ('confirmed', 'rejected')")
    return int(value)


async def open_accounts(pool: asyncpg.Pool, service: Service, sample: TpchSample,
                        credit_limit: Decimal) -> None:
    """Open the payments accounts of `sample`'s customers: TPC-H `c_acctbal` plus
    `credit_limit`."""
    stores = postgres_stores(pool, SystemClock(), service.registry)
    await stores[PAYMENTS].seed_states({
        str(c): open_account(c, b, credit_limit) for c, b in sample.customers})


async def _report(settings: ToolSettings, service: Service, sample: TpchSample,
                  pool: asyncpg.Pool, fleet: Fleet, injected: int, notes: list[str],
                  seconds: float) -> DemoReport:
    st = await business_states(service, pool)
    async with bucket_client(settings) as client:
        blobs = await S3BlobStore(client, settings.bucket()).keys()
    oracle = check_oracle(sample, st["orders"], st["ledger"], st[PAYMENTS], blobs,
                          settings.credit_limit)
    for violation in audit_logs(read_logs(fleet.log_dir)).violations:
        oracle.fail(violation)  # I1, I2, I7 from the processes' logs
    leftovers = await at_rest(pool)
    per_endpoint = fleet.events()
    events: Counter[str] = Counter()
    for (endpoint, event), n in per_endpoint.items():
        if endpoint != PAYMENTS:  # the in-process callee logs from the orders processes
            events[event] += n
    dead = (await dead_letters(settings.amqp(), service.registry.consuming(), peek=False,
                               database_dsn=settings.database())).total
    await pool.close()
    settlements = Counter({
        "processed": events["transaction.committed"],
        "duplicate": events["message.duplicate"],
        "retried": events["message.retried"],
        "dead_lettered": events["message.dead_lettered"],
    })
    return DemoReport(orders=len(sample.expected), settlements=settlements,
                      duplicates_injected=injected + sum(
                          n for (_, e), n in per_endpoint.items()
                          if e == "fault.duplicate_injected"),
                      conflicts=events["transaction.conflict"],
                      handler_runs=events["handler.invoked"], oracle=oracle,
                      leftovers=leftovers, dead_letters=dead, seconds=seconds, notes=notes)

