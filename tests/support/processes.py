"""The service as real processes for tests, and the test's view of their broker and database.

`eo consume` and `eo serve` run as subprocesses (the counters service by default:
`EO_SERVICE` = tests/support/counters) on a database and a RabbitMQ virtual host of the test
module's own; the test publishes, reads queue depths and consumers, and takes dead letters.

Typical use (see tests/integration/test_consumer_process.py)::

    @pytest.fixture(scope="module")
    def where() -> Iterator[Where]:
        with where_for("eo_it_mine", "eo-it-mine") as found:  # names get this run's pid
            yield found

    fleet = Fleet(where, blob_dir, log_dir)      # kill_all() at teardown
    counter = fleet.start("counter")             # one `eo consume --endpoint counter`
    bank = fleet.serve("bank", token)            # one `eo serve --endpoint bank`, port 0
    await fleet.ready(counter, bank)             # URL logged, then 200 on /ready or /health
    await until(check, 20, "what we wait for", fleet, rabbit)

The processes are forked from this test process's zygote (tools/zygote.py: the
framework imported once, 2.5 s of CPU saved per process), each an ordinary process of its
own; `Fleet(forked=False)` starts `eo` cold instead, for a test of the console entry point.

No port is chosen by the tests: a consumer's status port is left to the process
(`EO_METRICS_PORT` unset: the first free one from 9464) and a callee listens on port 0; each
logs its URL (`status_url` of `consumer.started`, `url` of `callee.serving`), which
`Proc.url` reads. Every process gets the settings of `Fleet.env` (retry delays
`Fleet.delays`, body limit `Fleet.max_body_bytes`, `EO_POOL_SIZE` = `Fleet.pool_size`: the
PostgreSQL server is shared, keep it small) plus what the caller passes; its stdout and
stderr (JSON log lines) go to `<log_dir>/<name>.log`, readable through `Proc.events`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import aio_pika
import asyncpg
import pika
import pytest

from adapters.postgres.admin import drop_database, ensure_database, with_database
from adapters.postgres.migrate import upgrade_async
from adapters.rabbitmq import topology
from application.codec import from_jsonable
from application.envelope import REASON_HEADER, TOKEN_HEADER
from tests.support.counters.registry import REGISTRY, SPEC
from tests.support.services import discover
from tools.zygote import Zygote, ZygoteProcess

ROOT = Path(__file__).resolve().parents[2]
#: The counters' endpoints with a work queue (what `eo consume` serves).
CONSUMING = tuple(REGISTRY.consuming())
#: Retry delays (s) of the processes and of the queues the tests declare: they must match.
DELAYS = (0.05, 0.1)
#: `x-delivery-limit`, the settings' default: queues a test declares must match the service's.
DELIVERY_LIMIT = 20
#: `EO_MAX_BODY_BYTES` of the processes: small, so an oversized body is cheap to send.
MAX_BODY_BYTES = 2048
#: The protocol tables, emptied by `reset`.
TABLES = ("eo_token", "eo_transaction_record", "eo_side_effect_record", "eo_deferred_cleanup",
          "eo_processed_message", "eo_stored_reply", "eo_http_request", "eo_http_tombstone",
          "eo_state_entry", "eo_inbox")
#: The log line and field where each kind of process says where it answers HTTP.
CONSUMER_URL = ("consumer.started", "status_url")
CALLEE_URL = ("callee.serving", "url")


# ---------------------------------------------------------------------------------------------
# where things are


#: this test run's own suffix: its process ID (distinct among runs alive at once) and six
#: random hex digits (distinct from a run that died earlier with the same ID, whose
#: databases and virtual hosts may still be there)
RUN_ID = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"


def this_run(name: str, separator: str = "_") -> str:
    """`name` with this test run's `RUN_ID` (joined by `separator`): two runs of the suite on
    one machine get different databases and virtual hosts."""
    return f"{name}{separator}{RUN_ID.replace('_', separator)}"


def _local_rabbitmqctl(url: str) -> bool:
    parts = urlsplit(url)
    return (parts.hostname in ("127.0.0.1", "localhost") and shutil.which("rabbitmqctl")
            is not None)


def _rabbitmqctl(*args: str) -> str:
    return subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True,
                          timeout=30, check=True).stdout


#: The virtual hosts this process made (`private_vhost`): the only ones `delete_vhost` deletes.
_MADE_VHOSTS: set[str] = set()


def private_vhost(url: str, vhost: str) -> str:
    """`url` on a new virtual host `vhost` (its user given all rights), made with
    `rabbitmqctl` when the broker is local; else `url` unchanged (callers delete their queues
    before each test anyway). The virtual host `url` names, a user's own, is never used for
    tests' queues when a private one can be made, and never deleted."""
    parts = urlsplit(url)
    if not _local_rabbitmqctl(url):
        return url
    try:
        if vhost not in _rabbitmqctl("list_vhosts").split():
            _rabbitmqctl("add_vhost", vhost)
            _MADE_VHOSTS.add(vhost)
        elif RUN_ID.replace("_", "-") in vhost:  # this run's, made before by another caller
            _MADE_VHOSTS.add(vhost)
        _rabbitmqctl("set_permissions", "-p", vhost, parts.username or "guest", ".*", ".*",
                     ".*")
    except (OSError, subprocess.SubprocessError):
        return url
    return urlunsplit(parts._replace(path=f"/{quote(vhost, safe='')}"))


@contextlib.contextmanager
def broker_user(url: str, name: str) -> Iterator[str]:
    """A RabbitMQ user `name` (this run's: pass a `this_run` name) with every right on the
    virtual host of `url`, made with `rabbitmqctl` and deleted at the end; yields `url` as
    that user. Fails the test when `rabbitmqctl` cannot manage the broker of `url`."""
    if not _local_rabbitmqctl(url):
        pytest.fail("a second broker user needs rabbitmqctl on this host for "
                    f"{urlsplit(url).hostname}")
    parts = urlsplit(url)
    vhost = parts.path.lstrip("/") or "/"
    password = uuid.uuid4().hex
    _rabbitmqctl("add_user", name, password)
    try:
        _rabbitmqctl("set_permissions", "-p", vhost, name, ".*", ".*", ".*")
        netloc = f"{name}:{password}@{parts.hostname}:{parts.port or 5672}"
        yield urlunsplit(parts._replace(netloc=netloc))
    finally:
        _rabbitmqctl("delete_user", name)


def delete_vhost(url: str) -> None:
    """Delete the virtual host of `url` with its queues when `private_vhost` made it in this
    process; nothing otherwise (the default one, a user's own, or no `rabbitmqctl`)."""
    vhost = unquote(urlsplit(url).path.lstrip("/"))
    if vhost in _MADE_VHOSTS and _local_rabbitmqctl(url):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            _rabbitmqctl("delete_vhost", vhost)
            _MADE_VHOSTS.discard(vhost)


def leftovers(server_dsn: str | None, amqp_url: str | None) -> list[str]:
    """The databases and virtual hosts named with this run's `RUN_ID` that still exist (a
    test that did not remove what it made), as `database <name>` / `vhost <name>`; what
    cannot be listed (a service not running, no `rabbitmqctl`) is not checked."""
    found: list[str] = []
    if server_dsn:
        async def databases() -> list[str]:
            conn = await asyncpg.connect(server_dsn, timeout=5)
            try:
                return [r["datname"] for r in await conn.fetch("SELECT datname FROM pg_database")]
            finally:
                await conn.close()
        with contextlib.suppress(OSError, asyncpg.PostgresError, TimeoutError):
            found += [f"database {d}" for d in asyncio.run(databases()) if RUN_ID in d]
    if amqp_url and _local_rabbitmqctl(amqp_url):
        marker = RUN_ID.replace("_", "-")
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            found += [f"vhost {v}" for v in _rabbitmqctl("list_vhosts").split()
                      if marker in v or RUN_ID in v]
    return found


_ZYGOTE: list[Zygote] = []


def shared_zygote() -> Zygote:
    """This test process's fork server (tools/zygote.py), started on first use and
    ended when the process exits (its children with it)."""
    if not _ZYGOTE:
        _ZYGOTE.append(Zygote())
        atexit.register(_ZYGOTE[0].close)
    return _ZYGOTE[0]


def eo_command() -> list[str]:
    """The `eo` command of this environment (the console script, else `python -c`)."""
    script = Path(sys.executable).with_name("eo")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from entrypoints.cli import main; main()"]


async def prepare_database(dsn: str) -> None:
    """Create the database of `dsn` if missing and migrate it to the head revision."""
    await ensure_database(dsn)
    await upgrade_async(dsn)


@contextlib.contextmanager
def private_database(server_dsn: str, database: str) -> Iterator[str]:
    """The DSN of database `database` on `server_dsn`'s server, created and migrated (from
    scratch: a left-over of an earlier run with the same name is dropped first), dropped on
    exit."""
    dsn = with_database(server_dsn, database)
    asyncio.run(drop_database(dsn))
    asyncio.run(prepare_database(dsn))
    try:
        yield dsn
    finally:
        asyncio.run(drop_database(dsn))


@dataclass(frozen=True)
class Where:
    """The database and the broker URL (maybe a private virtual host) of a test module."""

    dsn: str
    amqp_url: str


@contextlib.contextmanager
def where_for(database: str, vhost: str) -> Iterator[Where]:
    """Discover the services (tests/support/services.py), create and migrate the database
    `<database>_<pid>` and make the virtual host `<vhost>-<pid>` (`this_run`); both are
    deleted on exit."""
    services = discover()
    try:
        with private_database(services.postgres_dsn, this_run(database)) as dsn:
            url = private_vhost(services.amqp_url, this_run(vhost, "-"))
            try:
                yield Where(dsn, url)
            finally:
                delete_vhost(url)
    finally:
        services.close()


# ---------------------------------------------------------------------------------------------
# the processes


@dataclass
class Proc:
    """One service process; its stdout and stderr (JSON log lines) go to `log`. It says
    where it answers HTTP in the log line `url_event` (field `url_field`); `ready_path` is
    what `Fleet.ready` polls there, with `ready_headers` (e.g. a bearer token)."""

    name: str
    popen: subprocess.Popen[bytes] | ZygoteProcess
    log: Path
    url_event: str = CONSUMER_URL[0]
    url_field: str = CONSUMER_URL[1]
    ready_path: str = "/ready"
    ready_headers: Mapping[str, str] = field(default_factory=dict)
    _url: str | None = None

    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 30) -> str:
        return f"--- {self.name} (pid {self.popen.pid}) log tail:\n" + "\n".join(
            self.text().splitlines()[-lines:])

    def entries(self) -> list[dict[str, Any]]:
        """Every JSON log line (other lines are skipped)."""
        found = []
        for line in self.text().splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict):
                    found.append(entry)
        return found

    def events(self, name: str) -> list[dict[str, Any]]:
        """The JSON log lines whose `event` is `name`."""
        return [e for e in self.entries() if e.get("event") == name]

    @property
    def url(self) -> str | None:
        """The base URL the process logged (None until it did)."""
        if self._url is None:
            for entry in self.events(self.url_event):
                if entry.get(self.url_field):
                    self._url = str(entry[self.url_field])
        return self._url

    def get(self, path: str, timeout: float = 2.0,
            headers: Mapping[str, str] | None = None) -> tuple[int, str]:
        """GET `path` at `url` with `headers`: (status, body); (0, error) when nothing
        answers or no URL was logged yet. Blocking: call it through `asyncio.to_thread` from
        a test's event loop."""
        if self.url is None:
            return 0, f"{self.name} logged no {self.url_event} with {self.url_field} yet"
        try:
            request = urllib.request.Request(f"{self.url}{path}", headers=dict(headers or {}))
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError as exc:
            return 0, str(exc)


def calling(callee: str, url: str, token: str) -> dict[str, str]:
    """The environment of a process that calls `callee` over HTTP at `url` with `token`."""
    prefix = f"EO_CALLEES__{callee.upper()}__"
    return {f"{prefix}URL": url, f"{prefix}TOKEN": token}


@dataclass
class Fleet:
    """Starts service processes (of `service`, an `EO_SERVICE` value) and kills whatever is
    left of them at `kill_all`."""

    where: Where
    blob_dir: Path
    log_dir: Path
    service: str = SPEC
    delays: tuple[float, ...] = DELAYS
    max_body_bytes: int = MAX_BODY_BYTES
    pool_size: int = 2
    procs: list[Proc] = field(default_factory=list)
    #: fork the processes from this test process's zygote (`shared_zygote`: the framework
    #: imported once) instead of starting `eo` cold; False for a test of the console entry
    #: point itself
    forked: bool = True

    def env(self, **extra: str | None) -> dict[str, str]:
        """The environment of a process: this one's without `EO_` variables (but with
        `EO_TEST_` ones), the local profile on `where`, then `extra` (None removes a
        variable). `EO_METRICS_PORT` is not set: the process picks its status port."""
        inherited = {k: v for k, v in os.environ.items()
                     if not k.startswith("EO_") or k.startswith("EO_TEST_")}
        python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env: dict[str, str | None] = {
            **inherited, "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1",
            "EO_SERVICE": self.service, "EO_PROFILE": "local",
            "EO_DATABASE_DSN": self.where.dsn, "EO_AMQP_URL": self.where.amqp_url,
            "EO_RETRY_DELAYS_S": json.dumps(list(self.delays)), "EO_MAX_ATTEMPTS": "2",
            "EO_SWEEP_INTERVAL_S": "0.5", "EO_STALE_AFTER_S": "1",
            "EO_BLOB_DIR": str(self.blob_dir), "EO_BLOB_STORE": "directory",
            "EO_MAX_BODY_BYTES": str(self.max_body_bytes),
            "EO_LOG_LEVEL": "INFO", "EO_POOL_SIZE": str(self.pool_size),
            # dead letters stay in their queues, where these tests read what the consumers
            # dead-lettered; tests of the dead-letter store turn it on
            "EO_DEAD_LETTER_COLLECT": "false", **extra}
        return {k: v for k, v in env.items() if v is not None}

    def spawn(self, name: str, args: list[str], extra_env: Mapping[str, str | None],
              url: tuple[str, str] = CONSUMER_URL, ready_path: str = "/ready",
              ready_headers: Mapping[str, str] | None = None) -> Proc:
        """Start `eo <args>` as process `name` (log `<log_dir>/<name>.log`) with `extra_env`
        over `env()`; it logs its URL in `url` (event, field) and is ready when `ready_path`
        answers 200 to a GET with `ready_headers`."""
        log = self.log_dir / f"{name}.log"
        popen: subprocess.Popen[bytes] | ZygoteProcess
        if self.forked:
            popen = shared_zygote().spawn(args, self.env(**extra_env), log)
        else:
            with log.open("wb") as out:
                popen = subprocess.Popen(
                    [*eo_command(), *args], cwd=ROOT, env=self.env(**extra_env),
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        proc = Proc(name, popen, log, url[0], url[1], ready_path, dict(ready_headers or {}))
        self.procs.append(proc)
        return proc

    def start(self, endpoint: str, **extra_env: str | None) -> Proc:
        """`eo consume --endpoint <endpoint>`, named `<endpoint>-<n>` (n counts the
        processes started for it); its status port is its own choice (`Proc.url`)."""
        name = f"{endpoint}-{sum(p.name.startswith(f'{endpoint}-') for p in self.procs)}"
        return self.spawn(name, ["consume", "--endpoint", endpoint], extra_env)

    def serve(self, endpoint: str, token: str, max_body_bytes: int = 65536,
              **extra_env: str | None) -> Proc:
        """`eo serve --endpoint <endpoint>` on 127.0.0.1, port 0 (its URL: `Proc.url`), with
        bearer token `token` and body limit `max_body_bytes`; ready when /health answers."""
        prefix = f"EO_CALLEES__{endpoint.upper()}__"
        name = f"{endpoint}-{sum(p.name.startswith(f'{endpoint}-') for p in self.procs)}"
        env = {f"{prefix}HOST": "127.0.0.1", f"{prefix}PORT": "0", f"{prefix}TOKEN": token,
               f"{prefix}MAX_BODY_BYTES": str(max_body_bytes), **extra_env}
        return self.spawn(name, ["serve", "--endpoint", endpoint], env, CALLEE_URL, "/health")

    async def ready(self, *procs: Proc, timeout_s: float = 40.0) -> None:
        """Wait until every process logged its URL and answers 200 on its `ready_path`;
        fail with its log tail when it exits first or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            while True:
                if not proc.alive():
                    pytest.fail(f"{proc.name} exited with {proc.popen.returncode} before it "
                                f"was ready\n{proc.tail()}")
                status, _ = await asyncio.to_thread(proc.get, proc.ready_path, 1.0,
                                                    proc.ready_headers)
                if status == 200:
                    break
                if time.monotonic() > deadline:
                    pytest.fail(f"{proc.name} not ready after {timeout_s} s\n{proc.tail()}")
                await asyncio.sleep(0.1)

    async def exit_code(self, proc: Proc, timeout_s: float) -> int | None:
        """The process's exit code once it ended, or None after `timeout_s`."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            return await asyncio.to_thread(proc.popen.wait, timeout_s)
        return None

    def tails(self) -> str:
        return "\n".join(p.tail() for p in self.procs)

    def kill_all(self) -> None:
        """SIGKILL every process still running and reap them all."""
        for proc in self.procs:
            if proc.alive():
                proc.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=10)


# ---------------------------------------------------------------------------------------------
# the broker and the database, seen from the test


@dataclass
class Rabbit:
    """A publisher-confirm channel on the test's vhost, and queue inspection."""

    url: str
    connection: aio_pika.abc.AbstractConnection
    channel: aio_pika.abc.AbstractChannel
    delays: tuple[float, ...] = DELAYS

    async def publish(self, queue: str, body: bytes, message_id: str | None, type_: str | None,
                      headers: dict[str, Any] | None = None) -> None:
        """Publish persistently to `queue` and wait for the publisher confirm. aiormq gives
        a message without `message_id` a random one: see `publish_without_message_id`."""
        await self.channel.default_exchange.publish(aio_pika.Message(
            body, message_id=message_id, type=type_, headers=headers or {},
            content_type="application/json", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key=queue, mandatory=True)

    async def queue_exists(self, queue: str) -> bool:
        """Whether `queue` exists (what `topology.declare` asks before a dead-letter queue)."""
        channel = await self.connection.channel()
        try:
            await channel.declare_queue(queue, passive=True)
            return True
        except aio_pika.exceptions.ChannelClosed:
            return False
        finally:
            if not channel.is_closed:
                await channel.close()

    async def _counts(self, queue: str) -> tuple[int, int]:
        channel = await self.connection.channel()
        try:
            declared = await channel.declare_queue(queue, passive=True)
            result = declared.declaration_result
            return result.message_count or 0, result.consumer_count or 0
        except aio_pika.exceptions.ChannelClosed:
            return 0, 0
        finally:
            if not channel.is_closed:
                await channel.close()

    async def depth(self, queue: str) -> int:
        """Ready messages in `queue` as the broker counts them now (0: no such queue)."""
        return (await self._counts(queue))[0]

    async def consumers(self, queue: str) -> int:
        """Consumers of `queue` as the broker counts them now (0: no such queue)."""
        return (await self._counts(queue))[1]

    async def depths(self, endpoint: str) -> dict[str, int]:
        """Depth of the work, retry and dead-letter queues of `endpoint`, by queue name."""
        names = topology.queue_names(endpoint, self.delays)
        return {name: await self.depth(name)
                for name in (names.work, *names.retries, names.dead_letter)}

    async def take(self, queue: str, count: int) -> list[aio_pika.abc.AbstractIncomingMessage]:
        """Up to `count` messages off `queue` (acked), those there now."""
        declared = await self.channel.declare_queue(queue, passive=True)
        taken: list[aio_pika.abc.AbstractIncomingMessage] = []
        while len(taken) < count:
            message = await declared.get(no_ack=True, fail=False)
            if message is None:
                break
            taken.append(message)
        return taken

    def publish_without_message_id(self, queue: str, body: bytes, type_: str | None,
                                   headers: dict[str, Any] | None = None) -> None:
        """aiormq gives every message an ID; pika does not (blocking: run it in a thread).
        `headers` default to `{eo-token: "1"}`."""
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            connection.channel().basic_publish("", queue, body, pika.BasicProperties(
                type=type_, delivery_mode=2,
                headers={TOKEN_HEADER: "1"} if headers is None else headers))
        finally:
            connection.close()


async def reset(where: Where, delays: tuple[float, ...] = DELAYS,
                endpoints: Iterable[str] = CONSUMING) -> None:
    """Delete the endpoints' queues and empty the protocol tables."""
    await topology.delete_queues(where.amqp_url, list(endpoints), delays)
    conn = await asyncpg.connect(where.dsn)
    try:
        await conn.execute(f"TRUNCATE {', '.join(TABLES)}")
    finally:
        await conn.close()


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str,
                fleet: Fleet | None = None, rabbit: Rabbit | None = None,
                endpoints: Iterable[str] = CONSUMING) -> None:
    """Poll `check` every 0.1 s until it holds; fail naming `what` after `timeout_s`, with
    the processes' log tails and the dead letters' reasons of `endpoints` (which takes them
    off the dead-letter queues: the test is failing anyway)."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            dead = ""
            if rabbit is not None:
                for endpoint in endpoints:
                    dlq = topology.queue_names(endpoint).dead_letter
                    reasons = Counter(str((m.headers or {}).get(REASON_HEADER))
                                      for m in await rabbit.take(dlq, 1000))
                    dead += f"{dlq}: {dict(reasons)}\n" if reasons else ""
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}\n{dead}"
                        f"{fleet.tails() if fleet else ''}")
        await asyncio.sleep(0.1)


def logged_at(entry: dict[str, Any]) -> datetime:
    """The timestamp of a JSON log line."""
    return datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00"))


def metric(text: str, endpoint: str, event: str) -> float:
    """`eo_events_total{endpoint, event}` in a Prometheus scrape (0 when absent)."""
    pattern = (rf'^eo_events_total\{{endpoint="{re.escape(endpoint)}",'
               rf'event="{re.escape(event)}"\}} (\S+)$')
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def states(pool: asyncpg.Pool, endpoint: str, cls: type) -> dict[str, Any]:
    """The business states of `endpoint` by partition key, decoded as `cls`."""
    rows = await pool.fetch("SELECT partition_key, state FROM eo_transaction_record "
                            "WHERE endpoint = $1 AND state IS NOT NULL", endpoint)
    return {r["partition_key"]: from_jsonable(cls, r["state"]) for r in rows}


async def unfinished(pool: asyncpg.Pool) -> int:
    """Transaction records committed and not yet finished, all endpoints."""
    return int(await pool.fetchval(
        "SELECT count(*) FROM eo_transaction_record WHERE message_id IS NOT NULL"))


@contextlib.asynccontextmanager
async def fresh_fleet(where: Where, tmp_path: Path, pool_size: int = 2, service: str = SPEC,
                      endpoints: Iterable[str] = CONSUMING) -> AsyncIterator[Fleet]:
    """A `Fleet` of `service` over emptied queues (of `endpoints`) and tables (`reset`) with
    its own blob directory under `tmp_path`; every process it started is killed on exit."""
    await reset(where, endpoints=endpoints)
    blob_dir = tmp_path / "blobs"
    await asyncio.to_thread(blob_dir.mkdir)
    started = Fleet(where, blob_dir, tmp_path, service=service, pool_size=pool_size)
    try:
        yield started
    finally:
        started.kill_all()


@contextlib.asynccontextmanager
async def publisher(where: Where) -> AsyncIterator[Rabbit]:
    """A connection to the test's broker with a publisher-confirm channel, closed on exit."""
    connection = await aio_pika.connect(where.amqp_url)
    try:
        yield Rabbit(where.amqp_url, connection,
                     await connection.channel(publisher_confirms=True))
    finally:
        await connection.close()
