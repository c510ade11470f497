"""`eo demo --profile local`: the demo through RabbitMQ, PostgreSQL, an S3 API (moto server)
and the payments callee over HTTP, with consumer processes, duplicates injected at the
broker, and one consumer killed and restarted."""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
from pydantic import SecretStr

from adapters.postgres.pool import create_pool
from adapters.postgres.state_stream import PostgresStateStream
from adapters.rabbitmq import topology
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dispatcher import RabbitDispatcher
from adapters.s3.blob_store import S3BlobStore, ensure_bucket, s3_client_resource
from adapters.s3.moto_server import MotoServer
from adapters.system.clock import SystemClock
from application.codec import encode
from application.envelope import Envelope
from application.processor import Strategy
from domain.sample.payments import open_account
from entrypoints.chaos.checks import at_rest, audit_logs, dead_letters, queue_depth, read_logs
from entrypoints.demo.oracle_check import check_oracle
from entrypoints.demo.run import DemoReport, _Later
from entrypoints.demo.spark_ingest import ingest_twice
from entrypoints.demo.tpch import TpchSample
from entrypoints.embedded import ENDPOINTS
from entrypoints.local import LocalContainer, postgres_stores
from entrypoints.logging import configure_logging
from entrypoints.operations import ensure_database, migrate_all
from entrypoints.settings import Settings

DEMO_DATABASE = "eo_demo"


def demo_settings(base: Settings, blob_dir: Path) -> Settings:
    """`base` pointed at the demo's own database (dropped and re-created by each run)."""
    parts = urlsplit(base.database())
    dsn = urlunsplit(parts._replace(path=f"/{DEMO_DATABASE}"))
    return base.model_copy(update={"profile": "local", "database_dsn": SecretStr(dsn),
                                   "token_dsn": None,
                                   "blob_dir": blob_dir})


async def reset_service(settings: Settings) -> None:
    """Drop and re-create the database `settings` names (then migrate), and delete the
    endpoints' queues on its broker: a run starts from nothing."""
    parts = urlsplit(settings.database())
    database = parts.path.lstrip("/").replace('"', '""')
    admin = await asyncpg.connect(urlunsplit(parts._replace(path="/postgres")))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    finally:
        await admin.close()
    await ensure_database(settings.database())
    await migrate_all(settings)
    await topology.delete_queues(settings.amqp(), list(ENDPOINTS), len(settings.retry_delays_s))


def _secret(value: SecretStr | None) -> str:
    return value.get_secret_value() if value is not None else ""


def bucket_client(settings: Settings) -> AbstractAsyncContextManager[Any]:
    """An S3 client of the run's endpoint and credentials (settings'), for its bucket."""
    return s3_client_resource(settings.s3_endpoint_url, settings.s3_region,
                              _secret(settings.s3_access_key), _secret(settings.s3_secret_key))


async def empty_bucket(settings: Settings) -> None:
    """Create the run's bucket when missing, and delete every object in it: the oracle wants
    one invoice per order and no other object."""
    async with bucket_client(settings) as client:
        await ensure_bucket(client, settings.s3_bucket)
        blobs = S3BlobStore(client, settings.s3_bucket)
        for key in await blobs.keys():
            await blobs.delete(key)


class Fleet:
    """The consumer processes (`eo consume --endpoint X`), their logs, kill and restart."""

    def __init__(self, settings: Settings, log_dir: Path, duplicate_rate: float,
                 extra_env: dict[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.payments_url = f"http://127.0.0.1:{settings.payments_port}"
        self.env = {**os.environ, "EO_PROFILE": "local",
                    "EO_DATABASE_DSN": settings.database(), "EO_AMQP_URL": settings.amqp(),
                    "EO_BLOB_DIR": str(settings.blob_dir), "EO_METRICS_PORT": "0",
                    "EO_LOG_LEVEL": "INFO", "EO_SWEEP_INTERVAL_S": "1",
                    "EO_DUPLICATE_RATE": str(duplicate_rate), "EO_FAILPOINTS": "",
                    "EO_S3_ENDPOINT_URL": settings.s3_endpoint_url or "",
                    "EO_S3_BUCKET": settings.s3_bucket,
                    "EO_S3_ACCESS_KEY": _secret(settings.s3_access_key),
                    "EO_S3_SECRET_KEY": _secret(settings.s3_secret_key),
                    "EO_STRATEGIES": json.dumps({k: str(v)
                                                 for k, v in settings.strategies.items()}),
                    "EO_PAYMENTS_URL": self.payments_url,
                    "EO_PAYMENTS_PORT": str(settings.payments_port),
                    "EO_PAYMENTS_TOKEN": secrets.token_urlsafe(24),
                    "EO_POOL_SIZE": "3"}
        self.env.pop("EO_TOKEN_DSN", None)  # the co-located path unless extra_env says
        self.env.update(extra_env or {})
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: Counter[str] = Counter()

    def start(self, name: str, endpoint: str, env: dict[str, str] | None = None) -> None:
        """Start (or restart) process `name` consuming `endpoint` (`payments`: the callee),
        with `env` over the fleet's environment (e.g. `EO_FAILPOINTS` for this process)."""
        self.starts[name] += 1
        log = (self.log_dir / f"{name}.{self.starts[name]}.jsonl").open("wb")
        args = ["serve-payments"] if endpoint == "payments" else ["consume", "--endpoint",
                                                                  endpoint]
        command = [sys.executable, "-c", "from entrypoints.cli import main; main()", *args]
        self.procs[name] = subprocess.Popen(command, env={**self.env, **(env or {})},
                                            stdout=log, stderr=log)

    async def wait_for_payments(self, timeout_s: float = 60.0) -> None:
        """Until the payments callee answers /health; RuntimeError if it died or never did."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient() as client:
            while time.monotonic() < deadline:
                if self.procs["payments"].poll() is not None:
                    raise RuntimeError("the payments process exited: see its log in "
                                       f"{self.log_dir}")
                try:
                    if (await client.get(f"{self.payments_url}/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.5)
        raise RuntimeError(f"payments did not answer within {timeout_s} s")

    def kill(self, name: str) -> None:
        """SIGKILL: no clean-up, no ack; its deliveries go back to the queue."""
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    def stop_all(self, timeout_s: float = 30.0, keep: tuple[str, ...] = ()
                 ) -> dict[str, int | None]:
        """SIGTERM every process but `keep` (graceful), then SIGKILL stragglers; returns
        their exit codes."""
        procs = {n: p for n, p in self.procs.items() if n not in keep}
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        codes: dict[str, int | None] = {}
        for name, proc in procs.items():
            try:
                codes[name] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = None
        return codes

    def events(self) -> Counter[tuple[str, str]]:
        """Protocol events per (endpoint, event) over every log, killed processes' too."""
        counts: Counter[tuple[str, str]] = Counter()
        for path in self.log_dir.glob("*.jsonl"):
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    record = json.loads(line)
                    counts[(record.get("endpoint", ""), record.get("event", ""))] += 1
        return counts


async def run_local_demo(
    settings: Settings,
    sample: TpchSample,
    orders_consumers: int,
    duplicates: float,
    seed: int,
    log_dir: Path,
    on_progress: Callable[[int], None] = lambda _done: None,
    timeout_s: float = 900.0,
    ingest_dir: Path | None = None,
) -> DemoReport:
    """Run the sample through RabbitMQ, PostgreSQL, S3 (one moto server for every process)
    and HTTP (a `serve-payments` process) with consumer processes (one gateway,
    `orders_consumers` orders, one ledger), duplicates injected at the broker, one orders
    process killed with SIGKILL at a third of the way and restarted; then quiescence, a
    graceful stop, a final sweep and the oracle. Raises TimeoutError without quiescence.

    With `ingest_dir` (TPC-H tables of the sample's scale factor) the commands are not
    published to the gateway's queue: the Spark ingest writes them into the gateway's inbox,
    twice (the re-run adds nothing), and the gateway process relays them."""
    started = time.monotonic()
    moto = None
    if settings.s3_endpoint_url is None:  # one S3 API for every process (each would
        moto = MotoServer()                # otherwise start its own), gone after the run
        settings = settings.model_copy(update={"s3_endpoint_url": moto.start()})
    if settings.s3_access_key is None or settings.s3_secret_key is None:
        settings = settings.model_copy(update={"s3_access_key": SecretStr("local"),
                                               "s3_secret_key": SecretStr("local")})
    try:
        return await _run(settings, sample, orders_consumers, duplicates, seed, log_dir,
                          on_progress, timeout_s, started, ingest_dir)
    finally:
        if moto is not None:
            moto.stop()


async def _run(settings: Settings, sample: TpchSample, orders_consumers: int,
               duplicates: float, seed: int, log_dir: Path, on_progress: Callable[[int], None],
               timeout_s: float, started: float, ingest_dir: Path | None = None
               ) -> DemoReport:
    rng = random.Random(seed)
    await reset_service(settings)
    await empty_bucket(settings)
    pool = await create_pool(settings.database(), max_size=4)
    stores = postgres_stores(pool, SystemClock())
    await stores["payments"].seed_states({
        str(c): open_account(c, b, settings.credit_limit) for c, b in sample.customers})
    rabbit = RabbitConnection(settings.amqp())
    await rabbit.start()
    for endpoint in ENDPOINTS:
        await topology.declare(rabbit.channel, endpoint, settings.retry_delays_s,
                               settings.delivery_limit)
    fleet = Fleet(settings, log_dir, duplicates)
    fleet.start("payments", "payments")
    await fleet.wait_for_payments()
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
            busy = await queue_depth(settings.amqp(), list(ENDPOINTS),
                                     len(settings.retry_delays_s))
            busy += int(await pool.fetchval(  # inbox rows the gateway has yet to relay
                "SELECT count(*) FROM eo_inbox WHERE relayed_at IS NULL"))
            idle = idle + 1 if busy == 0 and done == last else 0
            last = done
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"no quiescence after {timeout_s} s")
        codes.update(fleet.stop_all(keep=("payments",)))
        # the final sweep may still DELETE requests on the callee: payments stops after it
        await final_sweep(settings.model_copy(update={
            "payments_url": fleet.payments_url,
            "payments_token": SecretStr(fleet.env["EO_PAYMENTS_TOKEN"])}))
    finally:
        codes.update(fleet.stop_all())  # payments, and everyone after an error
        await rabbit.close()
    notes.append(f"exit codes after SIGTERM: {codes}")
    return await _report(settings, sample, stores, pool, fleet, injected, notes,
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
        await asyncio.gather(*(dispatcher.dispatch("gateway", e) for e in batch))
    await asyncio.gather(*(dispatcher.dispatch("gateway", e) for e in late))
    return injected + len(late)


async def settled_orders(pool: asyncpg.Pool) -> int:
    """Orders confirmed or rejected so far (orders is always a token endpoint; the ledger
    may keep its state in a stream)."""
    value = await pool.fetchval(
        "SELECT count(*) FROM eo_transaction_record WHERE endpoint = 'orders' "
        "AND state->>'status' IN ('confirmed', 'rejected')")
    return int(value)


async def final_sweep(settings: Settings) -> None:
    """Every endpoint's sweeper once, as if every grace period had passed (quiescence)."""
    configure_logging("WARNING")  # the report is the output; the processes' logs are on disk
    container = LocalContainer(settings=settings.model_copy(update={"duplicate_rate": 0.0}))
    await container.init_resources()  # type: ignore[misc]
    try:
        system = await container.system()  # type: ignore[misc]
        later = _Later(system.clock, timedelta(seconds=settings.cleanup_grace_s
                                               + settings.stale_after_s + 1))
        for name in [*ENDPOINTS, "payments"]:
            await system.sweeper(name, later).sweep()
    finally:
        await container.shutdown_resources()  # type: ignore[misc]


async def business_states(settings: Settings, pool: asyncpg.Pool) -> dict[str, dict[str, Any]]:
    """Every endpoint's business state per partition (payments included): the transaction
    records' states, or the stream's newest snapshots for a `state` endpoint."""
    stores = postgres_stores(pool, SystemClock())
    states = {name: await store.states() for name, store in stores.items()}
    for name in ENDPOINTS:
        if settings.strategy(name) is Strategy.STATE:
            states[name] = await PostgresStateStream(pool, name, ENDPOINTS[name].state_type,
                                                     SystemClock()).states()
    return states


async def _report(settings: Settings, sample: TpchSample, stores: dict[str, Any],
                  pool: asyncpg.Pool, fleet: Fleet, injected: int, notes: list[str],
                  seconds: float) -> DemoReport:
    st = await business_states(settings, pool)
    async with bucket_client(settings) as client:
        blobs = await S3BlobStore(client, settings.s3_bucket).keys()
    oracle = check_oracle(sample, st["orders"], st["ledger"], st["payments"], blobs,
                          settings.credit_limit)
    for violation in audit_logs(read_logs(fleet.log_dir)).violations:
        oracle.fail(violation)  # I1, I2, I7 from the processes' logs
    leftovers = await at_rest(pool)
    per_endpoint = fleet.events()
    events: Counter[str] = Counter()
    for (endpoint, event), n in per_endpoint.items():
        if endpoint != "payments":  # the in-process callee logs from the orders processes
            events[event] += n
    dead = (await dead_letters(settings.amqp(), list(ENDPOINTS), peek=False)).total
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

