"""`eo demo --profile local`: the demo through RabbitMQ, PostgreSQL, an S3 API (moto server)
and the payments callee over HTTP, with consumer processes, duplicates injected at the
broker, and one consumer killed and restarted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import httpx
from pydantic import SecretStr

from adapters.postgres.admin import database_name
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
from application.strategy import Strategy
from domain.sample.payments import open_account
from entrypoints.local import LocalContainer, postgres_stores
from entrypoints.logs import configure_logging
from entrypoints.operations import migrate_all
from entrypoints.settings import CalleeSettings, Service, Settings
from tools.chaos.checks import at_rest, audit_logs, dead_letters, queue_depth, read_logs
from tools.demo.run import GATEWAY, PAYMENTS, DemoReport, _Later
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
    return base.model_copy(update={"profile": "local", "token_dsn": None,
                                   "s3_bucket": DEMO_BUCKET, "blob_dir": blob_dir})


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
        await ensure_bucket(client, settings.bucket())
        blobs = S3BlobStore(client, settings.bucket())
        for key in await blobs.keys():
            await blobs.delete(key)


def serving_url(log: Path) -> str | None:
    """The URL a callee process logged in `callee.serving`, or None (not yet)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if '"callee.serving"' in line:
            with contextlib.suppress(ValueError):
                return str(json.loads(line)["url"])
    return None


class Fleet:
    """The service's processes (`eo consume --endpoint X`, `eo serve --endpoint payments`),
    their logs, kill and restart. The payments callee starts on a free port it reports
    (`wait_for_payments` reads it from its log: `payments_url`); its restarts keep that
    port, and the consumers started after it call it there."""

    def __init__(self, settings: Settings, log_dir: Path, duplicate_rate: float,
                 extra_env: dict[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.payments_url: str | None = None
        self.payments_port = 0
        self.token = secrets.token_urlsafe(24)
        self.env = {**os.environ, "EO_PROFILE": "local",
                    "EO_DATABASE_DSN": settings.database(), "EO_AMQP_URL": settings.amqp(),
                    "EO_BLOB_DIR": str(settings.blob_dir), "EO_METRICS_PORT": "0",
                    "EO_LOG_LEVEL": "INFO", "EO_SWEEP_INTERVAL_S": "1",
                    "EO_DUPLICATE_RATE": str(duplicate_rate), "EO_FAILPOINTS": "",
                    "EO_S3_ENDPOINT_URL": settings.s3_endpoint_url or "",
                    "EO_S3_BUCKET": settings.bucket(),
                    "EO_S3_ACCESS_KEY": _secret(settings.s3_access_key),
                    "EO_S3_SECRET_KEY": _secret(settings.s3_secret_key),
                    "EO_STRATEGIES": json.dumps({k: str(v)
                                                 for k, v in settings.strategies.items()}),
                    "EO_CALLEES__PAYMENTS__TOKEN": self.token,
                    "EO_SERVICE": settings.service,
                    "EO_POOL_SIZE": "3"}
        for name, api in settings.apis.items():  # third-party APIs at a shared provider
            if api.url is not None:
                self.env[f"EO_APIS__{name.upper()}__URL"] = api.url
        self.env.pop("EO_TOKEN_DSN", None)  # the co-located path unless extra_env says
        self.env.update(extra_env or {})
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: Counter[str] = Counter()

    def start(self, name: str, endpoint: str, env: Mapping[str, str | None] | None = None
              ) -> None:
        """Start (or restart) process `name` consuming `endpoint` (`payments`: the callee),
        with `env` over the fleet's environment (e.g. `EO_FAILPOINTS` for this process; a
        None value unsets the variable)."""
        self.starts[name] += 1
        log = (self.log_dir / f"{name}.{self.starts[name]}.jsonl").open("wb")
        command = [sys.executable, "-c", "from entrypoints.cli import main; main()",
                   *self.args(endpoint)]
        self.procs[name] = subprocess.Popen(command, env=self.env_of(endpoint, env),
                                            stdout=log, stderr=log)

    @staticmethod
    def args(endpoint: str) -> list[str]:
        """The `eo` arguments of a process of `endpoint`."""
        verb = "serve" if endpoint == PAYMENTS else "consume"
        return [verb, "--endpoint", endpoint]

    def env_of(self, endpoint: str, env: Mapping[str, str | None] | None = None
               ) -> dict[str, str]:
        """The environment of a process of `endpoint`: the fleet's, the callee's port (the
        one it first got, on a restart) or its URL for a caller, then `env` (None: unset)."""
        own = {"EO_CALLEES__PAYMENTS__PORT": str(self.payments_port)}
        if endpoint != PAYMENTS and self.payments_url is not None:
            own = {"EO_CALLEES__PAYMENTS__URL": self.payments_url}
        merged = {**self.env, **own, **(env or {})}
        return {k: v for k, v in merged.items() if v is not None}

    def caller_settings(self, settings: S) -> S:
        """`settings` calling the fleet's payments process over HTTP (the final sweep's)."""
        url = self.payments_url
        if url is None:
            return settings
        callee = CalleeSettings.model_validate({"url": url, "token": self.token})
        return settings.model_copy(update={"callees": {**settings.callees, PAYMENTS: callee}})

    async def wait_for_payments(self, timeout_s: float = 60.0) -> None:
        """Until the payments callee has logged its URL (`callee.serving`) and answers
        /health; RuntimeError if it died or never did."""
        deadline = time.monotonic() + timeout_s
        log = self.log_dir / f"payments.{self.starts['payments']}.jsonl"
        async with httpx.AsyncClient() as client:
            while time.monotonic() < deadline:
                if self.procs["payments"].poll() is not None:
                    raise RuntimeError("the payments process exited: see its log in "
                                       f"{self.log_dir}")
                url = serving_url(log)
                try:
                    if url and (await client.get(f"{url}/health")).status_code == 200:
                        self.payments_url = url
                        self.payments_port = int(url.rsplit(":", 1)[1])
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.2)
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
    async with own_vhost(settings.amqp(), DEMO_VHOST, endpoints, len(settings.retry_delays_s),
                         "eo demo") as broker, \
            own_database(settings.database(), DEMO_DATABASE, keep_database) as dsn:
        settings = settings.model_copy(update={"amqp_url": SecretStr(broker.url),
                                               "database_dsn": SecretStr(dsn)})
        moto = None
        if settings.s3_endpoint_url is None:  # one S3 API for every process (each would
            moto = MotoServer()                # otherwise start its own), gone after the run
            settings = settings.model_copy(update={"s3_endpoint_url": moto.start()})
        if settings.s3_access_key is None or settings.s3_secret_key is None:
            settings = settings.model_copy(update={"s3_access_key": SecretStr("local"),
                                                   "s3_secret_key": SecretStr("local")})
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
        await topology.declare(rabbit, endpoint, settings.retry_delays_s,
                               settings.delivery_limit)
    fleet = Fleet(settings, log_dir, duplicates)
    fleet.start(PAYMENTS, PAYMENTS)
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
            busy = await queue_depth(settings.amqp(), service.registry.consuming(),
                                     len(settings.retry_delays_s))
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


async def final_sweep(settings: Settings, service: Service) -> None:
    """Every endpoint's sweeper once, as if every grace period had passed (quiescence)."""
    configure_logging("WARNING")  # the report is the output; the processes' logs are on disk
    container = LocalContainer(settings=settings.model_copy(update={"duplicate_rate": 0.0}),
                               service=service)
    await container.init_resources()  # type: ignore[misc]
    try:
        system = await container.system()  # type: ignore[misc]
        later = _Later(system.clock, timedelta(seconds=settings.cleanup_grace_s
                                               + settings.stale_after_s + 1))
        for name in service.registry.names():
            await system.sweeper(name, later).sweep()
    finally:
        await container.shutdown_resources()  # type: ignore[misc]


async def business_states(service: Service, pool: asyncpg.Pool) -> dict[str, dict[str, Any]]:
    """Every endpoint's business state per partition (callees included): the transaction
    records' states, or the stream's newest snapshots for a `state` endpoint."""
    stores = postgres_stores(pool, SystemClock(), service.registry)
    states = {name: await store.states() for name, store in stores.items()}
    for r in service.registry:
        if service.strategy(r.name) is Strategy.STATE:
            states[r.name] = await PostgresStateStream(pool, r.name, r.endpoint.state_type,
                                                       SystemClock()).states()
    return states


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

