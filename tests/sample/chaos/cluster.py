"""The chaos harness: the sample service as real processes that really die.

One `Cluster` per test module: a private database (`eo_chaos_<pid>`, plus
`eo_chaos_tokens_<pid>` for the general path of protocol 3.2; dropped at the end), a private
RabbitMQ virtual host (`eo-chaos-<pid>`, deleted at the end), one moto S3 server, and the
long-lived processes that carry no failpoints (`gateway`, `ledger`, `payments`: `eo consume`
/ `eo serve --endpoint payments` through the demo's `Fleet`, forked by a zygote that imported
the service once: tools/zygote.py). Each test starts its own orders processes with the
failpoints it needs (`EO_FAILPOINTS`), or replaces a long-lived process by one with
failpoints (restored afterwards); a process that exits is restarted once without its
failpoints, as an orchestrator would.

A test publishes a few TPC-H orders to the gateway, waits for quiescence (queues empty, every
order settled in the ledger, no token and no unfinished transaction left, logs quiet), then
`Run.verify` checks the protocol's invariants at rest: the oracle on the orders published,
nothing left (before and after a final sweep that acts as if every grace period had passed),
the dead letters expected, the log audit (I1, I2, I7; tools/chaos/checks.py), the
order of events (I4: no publication before its commit; I6: everything published before the
token was consumed) and that the handler ran again only after an attempt that did not commit
(a conflict, a retry or a crash).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
import structlog

from adapters.postgres.admin import drop_database, ensure_database, with_database
from adapters.postgres.migrate import upgrade_async
from adapters.postgres.pool import create_pool
from adapters.postgres.token_store import PostgresTokenStore
from adapters.rabbitmq import topology
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dispatcher import RabbitDispatcher
from adapters.s3.blob_store import S3BlobStore, ensure_bucket, s3_client_resource
from adapters.s3.moto_server import MotoServer
from adapters.system.clock import SystemClock
from application.codec import encode
from application.envelope import TOKEN_HEADER, Envelope
from application.errors import TransientError
from domain.sample.ledger import CustomerLedger
from domain.sample.orders import CARRIER
from domain.sample.payments import open_account
from entrypoints.faults import CRASH_EXIT
from entrypoints.local import postgres_stores
from entrypoints.service_spec import Service, resolve_service
from service.registry import REGISTRY
from tests.support.processes import private_vhost, this_run
from tests.support.services import discover
from tools.chaos.at_rest import at_rest, dead_letters
from tools.chaos.checks import (
    audit_logs,
    crashed_by_failpoint,
    open_attempts,
    read_logs,
    rerun_violations,
)
from tools.chaos.fleet import Fleet, final_sweep
from tools.fake_provider import fake_provider
from tools.settings import ToolSettings
from tools.tpch.data import Command, TpchSample, generate
from tools.tpch.oracle import check_oracle
from tools.zygote import Zygote

#: names of this test run's own: concurrent runs of the suite (several engineers, CI) never
#: share a database or a virtual host (ports: every server here binds port 0)
DATABASE = this_run("eo_chaos")
TOKEN_DATABASE = this_run("eo_chaos_tokens")
VHOST = this_run("eo-chaos", "-")
#: the sample's endpoints with a work queue
ENDPOINTS = tuple(REGISTRY.consuming())
#: spans a restart of the payments process (~4 s) before a follow-up is dead-lettered
RETRY_DELAYS = (0.05, 0.5, 2.0, 4.0)
MAX_ATTEMPTS = 8
CREDIT_LIMIT = Decimal("1000000")
LONG_LIVED = {"gateway": "gateway", "ledger": "ledger", "payments": "payments"}
QUIESCENCE_TIMEOUT_S = 120.0


# ---------------------------------------------------------------------------------------------
# where things are


async def _recreate(dsn: str) -> None:
    await drop_database(dsn)
    await ensure_database(dsn)
    await upgrade_async(dsn)


def _delete_vhost(amqp_url: str) -> None:
    vhost = urlsplit(amqp_url).path.lstrip("/")
    if vhost.startswith("eo-chaos-") and shutil.which("rabbitmqctl"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True,
                           timeout=30, check=True)


async def _delete_queues(amqp_url: str) -> None:
    await topology.delete_queues(amqp_url, list(ENDPOINTS), RETRY_DELAYS)


# ---------------------------------------------------------------------------------------------
# the sample


@cache
def tpch() -> TpchSample:
    """TPC-H at sf=0.001 (generated once per test session)."""
    return generate(0.001)


def pick_orders(count: int, seed: int = 1, max_lines: int = 2) -> TpchSample:
    """`count` whole orders of at most `max_lines` lines (few messages), of distinct
    customers, chosen by `seed`, with their customers only: a sub-sample the oracle checks."""
    sample = tpch()
    by_order: dict[int, list[Command]] = {}
    for command in sample.commands:
        by_order.setdefault(command.message.order_key, []).append(command)  # type: ignore[attr-defined]
    keys = sorted(k for k, cs in by_order.items() if len(cs) <= max_lines + 2)
    random.Random(seed).shuffle(keys)
    chosen: list[int] = []
    customers: set[int] = set()
    for key in keys:
        if sample.order_customers[key] not in customers:
            chosen.append(key)
            customers.add(sample.order_customers[key])
        if len(chosen) == count:
            break
    return replace(
        sample,
        commands=tuple(c for k in sorted(chosen) for c in by_order[k]),
        customers=tuple((c, b) for c, b in sample.customers if c in customers),
        expected={k: sample.expected[k] for k in sorted(chosen)},
        order_customers={k: sample.order_customers[k] for k in chosen})


# ---------------------------------------------------------------------------------------------
# logs of one process


def log_lines(path: Path) -> list[str]:
    """The lines of a process log (JSON events and, after a crash, the failpoint's line)."""
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def log_events(path: Path) -> list[dict[str, Any]]:
    """The JSON events of one process log, in order."""
    found = []
    for line in log_lines(path):
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
    return found


@dataclass
class Exit:
    """A process that exited during the test: its name, exit code and log."""

    name: str
    code: int | None
    log: Path

    @property
    def planned(self) -> bool:
        """Exited by the `crash` action of a failpoint the test set (exit 70 and its line)."""
        return self.code == CRASH_EXIT and crashed_by_failpoint(self.log)

    def crashed_at(self, failpoint: str) -> bool:
        """Exited by the `crash` action of `failpoint` (exit 70 and its line in the log)."""
        return self.code == CRASH_EXIT and f"failpoint {failpoint}: crash" in log_lines(self.log)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        return [e for e in log_events(self.log) if name is None or e.get("event") == name]

    def last(self, name: str) -> dict[str, Any]:
        """The last event `name` of the process before it died."""
        found = self.events(name)
        assert found, f"{self.name} logged no {name} before it exited (log {self.log})"
        return found[-1]


# ---------------------------------------------------------------------------------------------
# the cluster


@dataclass
class Spec:
    endpoint: str
    env: dict[str, str | None]


class ForkedFleet(Fleet):
    """The demo's `Fleet` whose processes are forked by a `Zygote` (the service imported
    once) instead of started from scratch: same environment, logs, kill and restart."""

    def __init__(self, zygote: Zygote, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zygote = zygote

    def start(self, name: str, endpoint: str, env: Mapping[str, str | None] | None = None
              ) -> None:
        self.starts[name] += 1
        log = self.log_dir / f"{name}.{self.starts[name]}.jsonl"
        self.procs[name] = self.zygote.spawn(  # type: ignore[assignment]
            self.args(endpoint), self.env_of(endpoint, env), log)


class Cluster:
    """Processes of one test module; see the module docstring. Synchronous parts only (the
    module-scoped fixture owns it); `Run` does the async work of one test."""

    def __init__(self, base: ToolSettings, log_dir: Path, general_path: bool,
                 zygote: Zygote, carrier: contextlib.ExitStack | None = None) -> None:
        """`carrier`: holds the fake carrier process (`base.http.apis`' URL), closed by
        `destroy`."""
        self.log_dir = log_dir
        self.carrier = carrier
        self.general_path = general_path
        self.settings = base
        self.service: Service = resolve_service(base, REGISTRY)
        env = {"EO_RETRY_DELAYS_S": json.dumps(list(RETRY_DELAYS)),
               "EO_MAX_ATTEMPTS": str(MAX_ATTEMPTS), "EO_STALE_AFTER_S": "1",
               "EO_SWEEP_INTERVAL_S": "1", "EO_HTTP_TIMEOUT_S": "5",
               "EO_CREDIT_LIMIT": str(CREDIT_LIMIT), "EO_BLOB_STORE": "s3",
               "PYTHONUNBUFFERED": "1"}
        self.fleet = ForkedFleet(zygote, base, log_dir, 0.0, extra_env=env)
        #: the payments callee's bearer token (the fleet's)
        self.token = self.fleet.token
        # `Fleet` drops EO_TOKEN_DSN from its environment: it goes with every start instead
        self.base_env = {"EO_TOKEN_DSN": base.tokens_database()} if general_path else {}
        self.specs: dict[str, Spec] = {}
        self.exits: list[Exit] = []
        self.restarted: set[str] = set()

    # processes ---------------------------------------------------------------------------

    def log_of(self, name: str) -> Path:
        return self.log_dir / f"{name}.{self.fleet.starts[name]}.jsonl"

    def gates_of(self, name: str) -> Path:
        """The directory of process `name`'s `wait:<gate>` failpoints (`EO_FAILPOINT_GATES`),
        emptied at each start."""
        return self.log_dir / "gates" / name

    def alive(self, name: str) -> bool:
        proc = self.fleet.procs.get(name)
        return proc is not None and proc.poll() is None

    def start(self, name: str, endpoint: str, failpoints: str = "",
              env: Mapping[str, str | None] | None = None) -> None:
        """(Re)start process `name` on `endpoint` with `failpoints` and `env`; a running
        process of that name is killed first. Does not wait: see `Run.ready`."""
        if self.alive(name):
            self.fleet.kill(name)
        full = {**self.base_env, "EO_FAILPOINTS": failpoints, **(env or {})}
        self.specs[name] = Spec(endpoint, full)
        gates = self.gates_of(name)
        shutil.rmtree(gates, ignore_errors=True)
        gates.mkdir(parents=True)
        self.fleet.start(name, endpoint, env={**full, "EO_FAILPOINT_GATES": str(gates)})

    def restart_dead(self) -> list[str]:
        """Restart, once, each process that exited (without its failpoints); returns them."""
        started = []
        for name, proc in list(self.fleet.procs.items()):
            code = proc.poll()
            if code is None or name not in self.specs:
                continue
            if not any(e.name == name and e.log == self.log_of(name) for e in self.exits):
                self.exits.append(Exit(name, code, self.log_of(name)))
            if name in self.restarted:
                continue
            self.restarted.add(name)
            spec = self.specs[name]
            self.start(name, spec.endpoint, "", {k: v for k, v in spec.env.items()
                                                 if k != "EO_FAILPOINTS"})
            started.append(name)
        return started

    def stop(self, name: str) -> None:
        """SIGTERM `name` (SIGKILL after 15 s) and forget it."""
        proc = self.fleet.procs.pop(name, None)
        self.specs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop_all(self) -> None:
        for name in list(self.fleet.procs):
            self.stop(name)

    def destroy(self) -> None:
        """Stop every process, drop the run's databases and delete its virtual host."""
        self.stop_all()
        if self.carrier is not None:
            self.carrier.close()
        asyncio.run(drop_database(self.settings.database()))
        if self.general_path:
            asyncio.run(drop_database(self.settings.tokens_database()))
        _delete_vhost(self.settings.amqp())

    def is_default(self, name: str) -> bool:
        spec = self.specs.get(name)
        return (spec is not None and self.alive(name) and spec.endpoint == LONG_LIVED[name]
                and spec.env == {**self.base_env, "EO_FAILPOINTS": ""})

    def tails(self, lines: int = 25) -> str:
        out = []
        for name in sorted(self.fleet.procs):
            text = log_lines(self.log_of(name))[-lines:]
            out.append(f"--- {name} ({self.log_of(name).name}):\n" + "\n".join(text))
        return "\n".join(out)


def make_cluster(tmp_dir: Path, zygote: Zygote, general_path: bool = False
                 ) -> tuple[Cluster, MotoServer]:
    """A module's cluster: databases re-created, queues deleted, moto started. The caller
    stops it (`cluster.stop_all()`, `moto.stop()`)."""
    services = discover()
    dsn = with_database(services.postgres_dsn, DATABASE)
    token_dsn = with_database(services.postgres_dsn, TOKEN_DATABASE) if general_path else None
    amqp = private_vhost(services.amqp_url, VHOST)
    asyncio.run(_recreate(dsn))
    if token_dsn:
        asyncio.run(_recreate(token_dsn))
    asyncio.run(_delete_queues(amqp))
    moto = MotoServer()  # port 0: the OS picks a free one while binding it
    endpoint = moto.start()
    log_dir = tmp_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    # one carrier for every orders process: they share its idempotency keys, as they would
    # share a real provider's (a sandbox of each process's own would not)
    carrier = contextlib.ExitStack()
    provider = carrier.enter_context(fake_provider(log_dir / "carrier.log"))
    settings = ToolSettings.model_validate(dict(
        profile="local", database_dsn=dsn, amqp_url=amqp, token_dsn=token_dsn,
        s3_endpoint_url=endpoint, s3_access_key="local", s3_secret_key="local",
        blob_store="s3", blob_dir=tmp_dir / "blobs",
        retry_delays_s=RETRY_DELAYS, max_attempts=MAX_ATTEMPTS, stale_after_s=1.0,
        sweep_interval_s=1.0, credit_limit=CREDIT_LIMIT, pool_size=2, failpoints="",
        duplicate_rate=0.0, callees={}, apis={CARRIER: {"url": provider.url}}))
    return Cluster(settings, log_dir, general_path, zygote, carrier), moto


# ---------------------------------------------------------------------------------------------
# one test


@dataclass
class Verified:
    """What `Run.verify` found, for the test's own assertions."""

    records: list[dict[str, Any]]
    audit: Any
    exits: list[Exit]
    before_sweep: dict[str, int]
    after_sweep: dict[str, int]
    dead: dict[str, int]
    dead_reasons: dict[str, list[str]]
    #: the bucket's keys before the final sweep (what the running system left)
    blobs_before: list[str]
    #: the invoice keys of the orders at rest
    invoices: set[str]
    #: IDs of the tokens left before the final sweep
    tokens_before: set[str]

    def events(self, name: str, **match: str) -> list[dict[str, Any]]:
        """The test's log events `name` whose fields equal `match`."""
        return [r for r in self.records if r.get("event") == name
                and all(str(r.get(k)) == v for k, v in match.items())]

    def runs(self, endpoint: str, message_id: str) -> int:
        """Handler runs of one message (every process, every attempt)."""
        return int(self.audit.runs(endpoint, message_id))

    def commits(self, endpoint: str, message_id: str) -> int:
        return len(self.events("transaction.committed", endpoint=endpoint,
                               message_id=message_id))

    def exit_of(self, name: str) -> Exit:
        found = [e for e in self.exits if e.name == name]
        assert found, f"{name} did not exit during the test"
        return found[0]


class Run:
    """One test on the module's cluster: connections, reset, publication, quiescence and the
    checks. Use through the `chaos` fixture."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.settings = cluster.settings
        self.started = datetime.now(UTC)
        self.pool: asyncpg.Pool | None = None
        self.token_pool: asyncpg.Pool | None = None
        self.rabbit: RabbitConnection | None = None
        self.sample: TpchSample | None = None
        self.ran: list[str] = []  # processes started by this test
        self.starts_before: Counter[str] = Counter()

    # set-up ------------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect, reset the stores and queues, and make sure the long-lived processes run
        with their defaults."""
        cluster = self.cluster
        for name in LONG_LIVED:
            if name in cluster.specs and not cluster.is_default(name):
                cluster.stop(name)
        cluster.exits.clear()
        cluster.restarted.clear()
        self.pool = await create_pool(self.settings.database(), max_size=2)
        self.token_pool = self.pool
        if cluster.general_path:
            self.token_pool = await create_pool(self.settings.tokens_database(), max_size=2)
        self.rabbit = RabbitConnection(self.settings.amqp())
        await self.rabbit.start()
        for endpoint in ENDPOINTS:
            await topology.declare(self.rabbit, endpoint, RETRY_DELAYS,
                                   self.settings.rabbitmq.delivery_limit)
        await self._purge()
        await self._truncate()
        await self._empty_bucket()
        missing = [n for n in LONG_LIVED if not cluster.alive(n)]
        for name in missing:
            cluster.start(name, LONG_LIVED[name])
        await self.ready(*missing)
        self.starts_before = Counter(cluster.fleet.starts)
        self.started = datetime.now(UTC)

    async def close(self) -> None:
        for name in self.ran:
            if name not in LONG_LIVED:
                await asyncio.to_thread(self.cluster.stop, name)
        if self.rabbit is not None:
            await self.rabbit.close()
        if self.token_pool is not None and self.token_pool is not self.pool:
            await self.token_pool.close()
        if self.pool is not None:
            await self.pool.close()

    async def _purge(self) -> None:
        assert self.rabbit is not None
        for endpoint in ENDPOINTS:
            names = topology.queue_names(endpoint, RETRY_DELAYS)
            for name in (names.work, *names.retries, names.dead_letter):
                queue = await self.rabbit.channel.declare_queue(name, passive=True)
                await queue.purge()

    async def _truncate(self) -> None:
        pools = {id(p): p for p in (self.pool, self.token_pool) if p is not None}
        for pool in pools.values():
            tables = [r["tablename"] for r in await pool.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename LIKE 'eo\\_%' AND tablename <> 'eo_schema_version'")]
            await pool.execute(f"TRUNCATE {', '.join(tables)}")

    async def _empty_bucket(self) -> None:
        s = self.settings
        async with s3_client_resource(s.blobs.s3_endpoint_url, s.blobs.s3_region, "local",
                                      "local") as c:
            await ensure_bucket(c, s.bucket())
            store = S3BlobStore(c, s.bucket())
            for key in await store.keys():
                await store.delete(key)

    async def blob_keys(self) -> list[str]:
        s = self.settings
        async with s3_client_resource(s.blobs.s3_endpoint_url, s.blobs.s3_region, "local",
                                      "local") as c:
            return await S3BlobStore(c, s.bucket()).keys()

    # processes ---------------------------------------------------------------------------

    async def start(self, name: str, endpoint: str, failpoints: str = "",
                    env: Mapping[str, str | None] | None = None) -> None:
        """Start process `name` (replacing a long-lived one of that name for this test) and
        wait until it consumes (or serves)."""
        self.cluster.start(name, endpoint, failpoints, env)
        self.ran.append(name)
        await self.ready(name)

    async def start_many(self, *procs: tuple[str, str, str]) -> None:
        """Start (name, endpoint, failpoints) processes in parallel and wait for all."""
        for name, endpoint, failpoints in procs:
            self.cluster.start(name, endpoint, failpoints)
            self.ran.append(name)
        await self.ready(*(name for name, _, _ in procs))

    async def ready(self, *names: str, timeout_s: float = 60.0) -> None:
        """Wait until each process logged `consumer.started` (payments: answers /health)."""
        deadline = time.monotonic() + timeout_s
        cluster = self.cluster
        for name in names:
            if cluster.specs[name].endpoint == "payments":
                await cluster.fleet.wait_for_callee(
                    "payments", max(1.0, deadline - time.monotonic()))
                continue
            while not any(e.get("event") == "consumer.started"
                          for e in log_events(cluster.log_of(name))):
                if not cluster.alive(name):
                    pytest.fail(f"{name} exited before it was ready\n{cluster.tails()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"{name} not ready after {timeout_s} s\n{cluster.tails()}")
                await asyncio.sleep(0.1)

    def open_gate(self, name: str, gate: str) -> None:
        """Let process `name`'s `wait:<gate>` failpoint go on (docs/fault-injection.md)."""
        (self.cluster.gates_of(name) / gate).touch()

    async def logged(self, name: str, event: str, timeout_s: float = 60.0,
                     since: str = "", **match: str) -> dict[str, Any]:
        """The first `event` whose fields include `match` in the log of process `name`'s
        current start, once it is there; fail after `timeout_s` or when the process exits
        without it. `since`: an event's ISO timestamp (`"timestamp"`); only events logged
        after it count (an earlier message's event of the same name must not stand in for
        the one awaited). What a test waits for before it opens a gate: an order of events,
        not a guess of how long they take."""
        deadline = time.monotonic() + timeout_s
        log = self.cluster.log_of(name)
        while True:
            for e in log_events(log):
                if (e.get("event") == event and str(e.get("timestamp", "")) > since
                        and all(str(e.get(k)) == v for k, v in match.items())):
                    return e
            if not self.cluster.alive(name):
                pytest.fail(f"{name} exited before logging {event} {match}\n"
                            f"{self.cluster.tails()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{name} did not log {event} {match} within {timeout_s} s\n"
                            f"{self.cluster.tails()}")
            await asyncio.sleep(0.05)

    async def exited(self, name: str, timeout_s: float = 60.0) -> None:
        """Wait until process `name` has exited (a failpoint crashed it); fail after
        `timeout_s`. The next `quiesce` restarts it."""
        deadline = time.monotonic() + timeout_s
        while self.cluster.alive(name):
            if time.monotonic() > deadline:
                pytest.fail(f"{name} still runs after {timeout_s} s\n{self.cluster.tails()}")
            await asyncio.sleep(0.1)

    # traffic -----------------------------------------------------------------------------

    async def seed(self, sample: TpchSample) -> None:
        """Open the payments accounts of `sample`'s customers; it is the test's sample."""
        assert self.pool is not None
        self.sample = sample
        stores = postgres_stores(self.pool, SystemClock(), REGISTRY)
        await stores["payments"].seed_states({
            str(c): open_account(c, b, CREDIT_LIMIT) for c, b in sample.customers})

    async def publish(self, commands: Iterable[Command]) -> None:
        """Commands to the gateway, as an outside producer sends them (natural IDs)."""
        assert self.rabbit is not None
        dispatcher = RabbitDispatcher(self.rabbit)
        for command in commands:
            await dispatcher.dispatch("gateway", Envelope(
                command.message_id, type(command.message).__name__, encode(command.message)))

    async def send_with_token(self, destination: str, message: object,
                              message_id: uuid.UUID | None = None,
                              headers: Mapping[str, str] | None = None) -> uuid.UUID:
        """A token-protected message straight to `destination`, as a token-path sender
        sends it: the token (claim check) first, then the delivery. Returns its ID."""
        assert self.rabbit is not None
        assert self.token_pool is not None
        envelope = Envelope(message_id or uuid.uuid4(), type(message).__name__,
                            encode(message), MappingProxyType({TOKEN_HEADER: "1",
                                                               **(headers or {})}))
        await PostgresTokenStore(self.token_pool).create(destination, [envelope])
        await RabbitDispatcher(self.rabbit).dispatch(destination, envelope)
        return envelope.message_id

    async def redeliver(self, destination: str, envelope: Envelope) -> None:
        """Publish a copy of `envelope` (same ID, same body) without touching its token."""
        assert self.rabbit is not None
        await RabbitDispatcher(self.rabbit).dispatch(destination, envelope)

    # observation -------------------------------------------------------------------------

    async def depth(self) -> int:
        """Ready messages in every work and retry queue (waiting out an outage of the
        test's own connection: a test may have the broker close every connection)."""
        assert self.rabbit is not None
        total = 0
        for endpoint in ENDPOINTS:
            names = topology.queue_names(endpoint, RETRY_DELAYS)
            for name in (names.work, *names.retries):
                for _ in range(100):
                    try:
                        total += (await self.rabbit.queue_counts(name))[0]
                        break
                    except TransientError:
                        await self.rabbit.wait_connected(5.0)
                        await asyncio.sleep(0.1)
                else:
                    pytest.fail(f"cannot inspect {name}\n{self.cluster.tails()}")
        return total

    async def settled(self) -> int:
        """Orders the ledger recorded (confirmed or rejected), one entry per event."""
        assert self.pool is not None
        books = await postgres_stores(self.pool, SystemClock(), REGISTRY)["ledger"].states()
        return sum(len(b.confirmed) + len(b.rejected) for b in books.values()
                   if isinstance(b, CustomerLedger))

    async def rest(self) -> dict[str, int]:
        """`at_rest` of the endpoint database, tokens counted where they live."""
        assert self.pool is not None
        assert self.token_pool is not None
        found = dict(await at_rest(self.pool))
        if self.token_pool is not self.pool:
            for key, value in (await at_rest(self.token_pool)).items():
                found[key] = found.get(key, 0) + value
        return found

    async def dead(self) -> dict[str, int]:
        """Dead letters per endpoint now (not consumed)."""
        return (await dead_letters(self.settings.amqp(), list(ENDPOINTS), peek=False,
                                   database_dsn=self.settings.database())).counts

    def attempts_in_flight(self) -> list[str]:
        """Attempts a live process started (`handler.invoked`) and has not ended yet: no
        commit of that attempt, nor a conflict, retry or dead letter of its message, logged
        after it. A stalled attempt (a `sleep` failpoint) keeps the system from being quiet
        even when its log is."""
        found: list[str] = []
        for name in self.cluster.fleet.procs:
            if not self.cluster.alive(name):
                continue
            found += [f"{name}: {m} ({a})" for (_, m), a in open_attempts(
                log_events(self.cluster.log_of(name)))]
        return found

    def _log_size(self) -> int:
        return sum(p.stat().st_size for p in self.cluster.log_dir.glob("*.jsonl"))

    async def quiesce(self, tokens: int = 0, settled: int | None = None,
                      quiet_s: float = 1.5, timeout_s: float = QUIESCENCE_TIMEOUT_S) -> None:
        """Wait until every queue is empty, `settled` orders (default: all published) are in
        the ledger, at most `tokens` tokens and no unfinished transaction remain, no attempt
        is in flight (`attempts_in_flight`) and no process logged anything for `quiet_s`;
        restart (once) each process that died on the way. Fails with the processes' log tails
        after `timeout_s`."""
        assert self.sample is not None
        want = len(self.sample.expected) if settled is None else settled
        deadline = time.monotonic() + timeout_s
        quiet_since, size = time.monotonic(), -1
        while True:
            restarted = self.cluster.restart_dead()
            if restarted:
                await self.ready(*restarted)
            now_size = self._log_size()
            if now_size != size:
                quiet_since, size = time.monotonic(), now_size
            rest = await self.rest()
            done = (await self.depth() == 0 and await self.settled() >= want
                    and rest.get("tokens in flight", 0) <= tokens
                    and rest.get("unfinished transaction records", 0) == 0
                    and all(self.cluster.alive(n) for n in self.cluster.specs)
                    and not self.attempts_in_flight())
            if done and time.monotonic() - quiet_since >= quiet_s:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"no quiescence after {timeout_s} s: depth {await self.depth()}, "
                            f"settled {await self.settled()}/{want}, at rest {rest}, "
                            f"attempts in flight {self.attempts_in_flight()}\n"
                            f"{self.cluster.tails()}")
            await asyncio.sleep(0.25)

    async def final_sweep(self) -> None:
        """Every sweeper once, as if every grace period had passed (the demo's). It sets the
        test process's structlog to WARNING: the configuration is restored afterwards."""
        saved = structlog.get_config()
        try:
            await self._final_sweep()
        finally:
            structlog.configure(**saved)

    async def _final_sweep(self) -> None:
        fleet = self.cluster.fleet
        await final_sweep(fleet.caller_settings(self.settings), self.cluster.service)

    # checks ------------------------------------------------------------------------------

    def records(self) -> list[dict[str, Any]]:
        """The log events of this test, every process (killed ones too)."""
        return [r for r in read_logs(self.cluster.log_dir)
                if "timestamp" in r and _at(r) >= self.started]

    def lines(self, name: str) -> list[str]:
        """Every log line of process `name`, all its starts (JSON events and plain lines)."""
        first = self.starts_before.get(name, 0) + 1
        return [line for i in range(first, self.cluster.fleet.starts[name] + 1)
                for line in log_lines(self.cluster.log_dir / f"{name}.{i}.jsonl")]

    async def verify(self, tokens: int = 0, dead: Mapping[str, int] | None = None,
                     settled: int | None = None, orphan_tokens: int = 0) -> Verified:
        """Quiescence, then the invariants at rest (see the module docstring). `tokens`:
        tokens that stay (those of dead letters); `dead`: dead letters per endpoint;
        `orphan_tokens`: tokens of aborted attempts that only the deferred clean-up (the
        final sweep) may delete."""
        assert self.pool is not None
        assert self.sample is not None
        await self.quiesce(tokens=tokens + orphan_tokens, settled=settled)
        before = await self.rest()
        blobs_before = await self.blob_keys()
        assert self.token_pool is not None
        tokens_before = {str(r["message_id"]) for r in await self.token_pool.fetch(
            "SELECT message_id FROM eo_token")}
        await self.final_sweep()
        after = await self.rest()
        stores = postgres_stores(self.pool, SystemClock(), REGISTRY)
        orders = await stores["orders"].states()
        oracle = check_oracle(self.sample, orders,
                              await stores["ledger"].states(),
                              await stores["payments"].states(), await self.blob_keys(),
                              CREDIT_LIMIT)
        letters = await dead_letters(self.settings.amqp(), list(ENDPOINTS),
                                     database_dsn=self.settings.database())
        found_dead = {k: v for k, v in letters.counts.items() if v}
        records = self.records()
        audit = audit_logs(records)
        exits = list(self.cluster.exits)
        result = Verified(records, audit, exits, before, after, found_dead, letters.reasons,
                          blobs_before, {o.invoice_key for o in orders.values() if o.invoice_key},
                          tokens_before)
        tails = self.cluster.tails()
        assert not oracle.violations, f"{oracle.violations}\n{tails}"
        assert oracle.confirmed + oracle.rejected == len(self.sample.expected)
        # the running system repaired everything but the deferred clean-ups (due after the
        # grace period), which only the final sweep may do
        leftover = {k: v for k, v in before.items()
                    if v and not k.startswith("deferred") and not k.startswith("aborted")
                    and not (k == "tokens in flight" and v == tokens + orphan_tokens)}
        assert not leftover, f"left before the final sweep: {before}\n{tails}"
        assert {k: v for k, v in after.items()
                if v and not (k == "tokens in flight" and v == tokens)
                } == {}, f"left after the final sweep: {after}"
        assert found_dead == dict(dead or {}), f"dead letters {found_dead}\n{tails}"
        assert audit.violations == [], f"{audit.violations}\n{tails}"
        ordering = ordering_violations(records)
        assert not ordering, f"{ordering}\n{tails}"
        unexplained = rerun_violations(records, [e.events() for e in exits if e.planned])
        assert not unexplained, f"{unexplained}\n{tails}"
        for e in exits:  # a process died only by a crash failpoint
            assert e.code == CRASH_EXIT, f"{e.name} exited with {e.code}\n{tails}"
        return result


def _at(record: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(record["timestamp"]).replace("Z", "+00:00"))


def ordering_violations(records: list[dict[str, Any]]) -> list[str]:
    """I4 and I6 as far as the logs show them: every publication of an attempt's side effect
    is logged after that attempt's commit (no ghost output), and every side effect published
    for a message had been published before the message's token was first consumed."""
    committed: dict[tuple[str, str, str], datetime] = {}
    consumed: dict[tuple[str, str], datetime] = {}
    published: dict[tuple[str, str], dict[str, datetime]] = {}
    for r in records:
        event, at = r.get("event"), _at(r)
        key = (str(r.get("endpoint")), str(r.get("message_id")))
        if event == "transaction.committed":
            attempt = (*key, str(r.get("attempt_id")))
            committed[attempt] = min(at, committed.get(attempt, at))
        elif event == "token.consumed":
            consumed[key] = min(at, consumed.get(key, at))
    problems = []
    for r in records:
        if r.get("event") != "side_effect.published":
            continue
        at = _at(r)
        key = (str(r.get("endpoint")), str(r.get("message_id")))
        attempt = (*key, str(r.get("attempt_id")))
        if attempt not in committed or committed[attempt] > at:
            problems.append(f"I4: {r.get('kind')} {r.get('key')} of {attempt} published "
                            "before (or without) its commit")
        first = published.setdefault(key, {})
        first[str(r.get("key"))] = min(at, first.get(str(r.get("key")), at))
    for key, keys in published.items():
        late = [k for k, at in keys.items() if key in consumed and at > consumed[key]]
        if late:
            problems.append(f"I6: {key} consumed before {late} were published")
    return problems


def crashed(result: Verified, failpoint: str, name: str = "orders-a") -> None:
    """Assert that process `name` really died at `failpoint` (exit code 70 and the
    failpoint's line in its log)."""
    process = result.exit_of(name)
    assert process.crashed_at(failpoint), f"{name} exited {process.code}, not at {failpoint}"
