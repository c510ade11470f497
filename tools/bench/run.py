"""The runs of `eo bench`: each path's consumer in processes of its own draining a preloaded
queue (throughput, CPU per message per process group), then the same consumers under a fixed
offered load (latency); the template's paths and the two references (tools/bench/references.py)
in the same run, interleaved round by round."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import psutil
from aio_pika.abc import AbstractIncomingMessage

from adapters.postgres.admin import database_name
from adapters.postgres.migrate import upgrade_async
from adapters.postgres.pool import create_pool
from adapters.postgres.token_store import PostgresTokenStore
from adapters.rabbitmq import topology
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dispatcher import envelope_message
from application.codec import encode
from application.defaults import PREFETCH_IN_BATCHES
from application.envelope import TOKEN_HEADER, Envelope
from tools.bench import endpoint as bench
from tools.bench import references
from tools.bench.otlp_sink import SpanCount, otlp_sink
from tools.bench.report import BenchResult, Params, RunFigures, percentile_ms
from tools.bench.worker import RETRY_DELAYS_S, TEMPLATE_PATHS
from tools.scratch import fresh_name, own_database, own_vhost

ROOT = Path(__file__).resolve().parents[2]
PATHS = ("token", "token-batched", "outbox", "state", "minimal", "minimal-batched",
         "faststream", "traced-token", "traced-token-batched")
#: process-group name -> the process names (psutil) whose CPU it sums
GROUPS = {"postgresql": ("postgres",), "rabbitmq": ("beam.smp", "erl_child_setup")}
_EO_TABLES = ("eo_transaction_record", "eo_side_effect_record", "eo_deferred_cleanup",
              "eo_processed_message", "eo_stored_reply", "eo_state_entry")
_NEWEST = ("(SELECT DISTINCT ON (partition_key) state FROM eo_state_entry WHERE endpoint = $1 "
           "ORDER BY partition_key, version DESC) AS newest")
_COUNT = "coalesce(sum((state->>'count')::bigint), 0)"
#: The bench's database is `<the name --database-dsn gives, else this>_<pid>_<hex>`.
BENCH_DATABASE = "eo_bench"
#: Its virtual host (on a broker this host administers) is `<this>-<pid>-<hex>`.
BENCH_VHOST = "eo-bench"


def group_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) used so far by each of `GROUPS`' processes, summed."""
    totals = dict.fromkeys(GROUPS, 0.0)
    for proc in psutil.process_iter(["name", "cpu_times"]):
        times = proc.info["cpu_times"]
        if times is None:
            continue
        for group, names in GROUPS.items():
            if proc.info["name"] in names:
                totals[group] += times.user + times.system
    return totals


class _Sink:
    """Consumes a run's sink queue: receipt times of distinct outputs (keyed by the
    producer's `sent_at_ns`), their latency, and the process groups' CPU at the first and
    at the expected output."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.duplicates = 0
        self._expect(0)

    def _expect(self, count: int) -> None:
        self.target, self.done = len(self.seen) + count, asyncio.Event()
        self.first_ns = self.last_ns = 0
        self.cpu_first: dict[str, float] = {}
        self.cpu_last: dict[str, float] = {}
        self.latencies_ns: list[int] = []

    def expect(self, count: int) -> None:
        """Wait for `count` more distinct outputs (`done` is set at the last)."""
        self._expect(count)

    async def start(self, connection: RabbitConnection, queue: str) -> None:
        self._channel = await connection.open_channel(prefetch=1000)
        self._queue = await self._channel.declare_queue(queue, passive=True)
        self._tag = await self._queue.consume(self._on_message)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        now = time.monotonic_ns()
        await message.ack()
        sent = int(json.loads(message.body)["sent_at_ns"])  # unique per incoming message
        if sent in self.seen:
            self.duplicates += 1
            return
        self.seen.add(sent)
        self.latencies_ns.append(now - sent)
        if not self.first_ns:
            self.first_ns, self.cpu_first = now, group_cpu_s()
        if len(self.seen) == self.target:
            self.last_ns, self.cpu_last = now, group_cpu_s()
            self.done.set()

    async def stop(self) -> None:
        await self._queue.cancel(self._tag)
        await self._channel.close()


@dataclass
class _Producer:
    """Publishes deposits to a work queue (creating their tokens first on a token path);
    `sent_at_ns` is unique and strictly increasing, the output's key at the sink."""

    params: Params
    driver: RabbitConnection
    tokens: PostgresTokenStore
    work: str
    token: bool
    rng: random.Random
    last: int = 0
    #: how long each paced message's token insert took (ns): part of its latency
    inserts_ns: list[int] = field(default_factory=list)

    def _next(self) -> Envelope:
        self.last = max(time.monotonic_ns(), self.last + 1)
        deposit = bench.Deposit(f"acct-{self.rng.randrange(self.params.partitions)}",
                                self.rng.randint(1, 10_000), self.last)
        headers = MappingProxyType({TOKEN_HEADER: "1"} if self.token else {})
        return Envelope(uuid.uuid4(), "Deposit", encode(deposit), headers)

    async def _send(self, batch: list[Envelope], timed: bool = False) -> None:
        """Create the batch's tokens (a token path), then publish it; with `timed`, the
        token insert's duration goes to `inserts_ns` (the sender's part of the latency)."""
        if self.token:
            began = time.monotonic_ns()
            await self.tokens.create(self.work, batch)
            if timed:
                self.inserts_ns.append(time.monotonic_ns() - began)
        await asyncio.gather(*(self.driver.publish(self.work, envelope_message(e))
                               for e in batch))

    async def preload(self, count: int) -> list[uuid.UUID]:
        """Publish `count` deposits as fast as confirms allow; returns their IDs."""
        ids: list[uuid.UUID] = []
        for start in range(0, count, 200):
            batch = [self._next() for _ in range(min(200, count - start))]
            await self._send(batch)
            ids += [e.message_id for e in batch]
        return ids

    async def paced(self, count: int, rate_per_s: float) -> list[uuid.UUID]:
        """Publish `count` deposits at `rate_per_s`, each at its scheduled time."""
        loop, ids = asyncio.get_running_loop(), []
        start = loop.time()
        for i in range(count):
            await asyncio.sleep(max(0.0, start + i / rate_per_s - loop.time()))
            envelope = self._next()
            await self._send([envelope], timed=True)  # the sender's token insert timed apart
            ids.append(envelope.message_id)
        return ids


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
            own_vhost(params.amqp_url, BENCH_VHOST, (), len(RETRY_DELAYS_S), "eo bench") as broker:
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
            for path, processes in params.runs:
                figures = await _run(params, path, processes, round_no, admin, driver, spawn,
                                     spans)
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
    names = topology.queue_names(work, len(RETRY_DELAYS_S))
    for name in (names.work, *names.retries, names.dead_letter, sink, f"{sink}.dlq"):
        await driver.channel.queue_delete(name)


async def truncate_tables(admin: Any) -> None:
    """Every run starts from empty tables (of the bench's own database), the template's as
    the references': deleted rows would stay behind as dead tuples until a vacuum (a server
    with autovacuum off, as CI configurations may have, made each run read those of all the
    runs before it)."""
    await admin.execute(f"TRUNCATE eo_token, {', '.join((*_EO_TABLES, *references.TABLES))}")


async def spawn_worker(config: dict[str, Any], prefix: Sequence[str] = (),
                       start_timeout_s: float = 60) -> asyncio.subprocess.Process:
    """Start a consumer process (`python -m tools.bench.worker '<config>'`, after the
    command `prefix`) and wait until it is ready; its stderr goes to a file (a pipe nobody
    reads while it runs would fill and stop it), read back when it fails. Raises
    RuntimeError when it exits before it is ready, TimeoutError after `start_timeout_s`
    (the process is killed first: an orphan would go on consuming the bench's queues)."""
    errors = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the process
    proc = await asyncio.create_subprocess_exec(
        *prefix, sys.executable, "-m", "tools.bench.worker", json.dumps(config), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=errors)
    _ERRORS[proc.pid] = errors
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), start_timeout_s)
    except BaseException:  # a timeout or a cancellation: no consumer is left behind
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        _stderr(proc)
        raise
    if not line:
        raise RuntimeError(f"{config['path']}: the consumer did not start: {_stderr(proc)}")
    return proc


_ERRORS: dict[int, Any] = {}


def _stderr(proc: asyncio.subprocess.Process) -> str:
    errors = _ERRORS.pop(proc.pid, None)
    if errors is None:
        return ""
    errors.seek(0)
    text = str(errors.read().decode(errors="replace"))
    errors.close()
    return text[-2000:]


async def _stop(proc: asyncio.subprocess.Process, path: str) -> dict[str, Any]:
    if proc.returncode is None:
        proc.terminate()
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    lines = out.decode().strip().splitlines()
    stderr = _stderr(proc)
    if not lines:
        raise RuntimeError(f"{path}: the consumer reported nothing: {stderr}")
    report: dict[str, Any] = json.loads(lines[-1])
    if report.get("failure"):
        raise RuntimeError(f"{path}: the consumer failed: {report['failure']}")
    return report


def _cpu_at(samples: list[list[float]], t_ns: int) -> float:
    """A process's CPU seconds at `t_ns`, interpolated between its samples."""
    before = [s for s in samples if s[0] <= t_ns]
    after = [s for s in samples if s[0] >= t_ns]
    if not before:
        return after[0][1]
    if not after:
        return before[-1][1]
    (t0, c0), (t1, c1) = before[-1], after[0]
    return c0 if t1 == t0 else c0 + (c1 - c0) * (t_ns - t0) / (t1 - t0)


async def _run(params: Params, path: str, processes: int, round_no: int, admin: Any,
               driver: RabbitConnection, spawn: Any, spans: SpanCount | None = None
               ) -> RunFigures:
    """One run, on queues declared for it and deleted after it (also when it fails: on a
    virtual host the bench shares, nothing of its own is left behind). `spans`: the OTLP
    sink's count, for a traced path's `at_rest["spans_exported"]`."""
    work = f"{params.prefix}-{path}-{processes}"
    sink = f"{params.prefix}-sink-{path}-{processes}"
    await _declare(driver, work, sink)
    try:
        return await _measured(params, path, processes, round_no, admin, driver, spawn, work,
                               sink, spans)
    finally:
        await _delete(driver, work, sink)


async def _measured(params: Params, path: str, processes: int, round_no: int, admin: Any,
                    driver: RabbitConnection, spawn: Any, work: str, sink: str,
                    spans: SpanCount | None = None) -> RunFigures:
    label = path if processes == 1 else f"{path} x{processes}"
    spans_before = spans.total if spans is not None else 0
    n = params.messages
    await truncate_tables(admin)
    token = TEMPLATE_PATHS.get(path, ("",))[0] == "token"
    producer = _Producer(params, driver, PostgresTokenStore(admin), work, token,
                         random.Random(params.seed + round_no))
    incoming = await producer.preload(n)
    receiver = _Sink()
    receiver.expect(n)
    await receiver.start(driver, sink)
    batched = path.endswith("batched")
    in_flight = params.batch_size * PREFETCH_IN_BATCHES if batched else params.in_flight
    config = {"path": path, "work": work, "sink": sink, "database_dsn": params.database_dsn,
              "amqp_url": params.amqp_url, "in_flight": in_flight,
              "batch_size": params.batch_size, "batch_wait_s": params.batch_wait_ms / 1000,
              "otlp_endpoint": params.otlp_endpoint}
    procs: list[asyncio.subprocess.Process] = []
    reports: list[dict[str, Any]] = []
    try:
        for _ in range(processes):  # inside: a failed start stops those already started
            procs.append(await spawn(config))
        await _wait(receiver, procs, 60 + n * 0.05, label)
        first, last = receiver.first_ns, receiver.last_ns
        seconds = (last - first) / 1e9
        throughput = (n - 1) / seconds
        cpu = {g: (receiver.cpu_last[g] - receiver.cpu_first[g]) for g in GROUPS}
        offered = throughput * params.load_ratio
        count = max(50, min(params.latency_messages, int(offered * 5)))
        receiver.expect(count)
        incoming += await producer.paced(count, offered)
        await _wait(receiver, procs, 60 + count / offered * 2, label)
        latencies = receiver.latencies_ns
    finally:
        for proc in procs:
            reports.append(await _stop(proc, label))
        await receiver.stop()
    cpu["python"] = sum(_cpu_at(r["samples"], last) - _cpu_at(r["samples"], first)
                        for r in reports)
    rows = await _at_rest(admin, path, work, incoming)
    if spans is not None and _traced(path):  # exported by the stop at the latest
        rows["spans_exported"] = spans.total - spans_before
    per_message = {g: cpu[g] * 1000 / (n - 1) for g in ("python", *GROUPS)}
    per_message["total"] = sum(per_message.values())
    round_trips = sum(r["round_trips"] for r in reports) / len(incoming)
    return RunFigures(label, path, processes, round_no, seconds, throughput, per_message,
                      offered, percentile_ms(latencies, 0.50), percentile_ms(latencies, 0.99),
                      round_trips, rows["dedup_rows"], rows, receiver.duplicates,
                      percentile_ms(producer.inserts_ns, 0.50),
                      percentile_ms(producer.inserts_ns, 0.99))


async def _wait(receiver: _Sink, procs: list[asyncio.subprocess.Process], timeout_s: float,
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


async def _at_rest(admin: Any, path: str, work: str, incoming: list[uuid.UUID]
                   ) -> dict[str, int]:
    """Rows left once the consumers stopped: the handler's count summed over the accounts,
    and each path's deduplication rows (`dedup_rows`, see report.DEDUP_ROWS)."""
    strategy = TEMPLATE_PATHS.get(path, (path,))[0]
    if strategy in ("token", "outbox"):
        processed = f"SELECT {_COUNT} FROM eo_transaction_record WHERE endpoint = $1"
    elif strategy == "state":
        processed = f"SELECT {_COUNT} FROM {_NEWEST}"
    else:
        processed = f"SELECT {_COUNT} FROM bench_state WHERE $1::text IS NOT NULL"
    dedup = {"token": ("SELECT count(*) FROM eo_token WHERE message_id = ANY($1)", incoming),
             "outbox": ("SELECT count(*) FROM eo_processed_message WHERE endpoint = $1", work),
             "state": ("SELECT count(*) FROM eo_state_entry WHERE endpoint = $1", work)}.get(
        strategy, ("SELECT count(*) FROM bench_inbox WHERE $1::text IS NOT NULL", work))
    queries = {
        "processed": (processed, work),
        "dedup_rows": dedup,
        "side_effect_records_left": (
            "SELECT count(*) FROM eo_side_effect_record WHERE endpoint = $1", work),
        "unfinished_trs": ("SELECT count(*) FROM eo_transaction_record WHERE endpoint = $1 "
                           "AND message_id IS NOT NULL", work),
        "outbox_rows_left": ("SELECT count(*) FROM bench_outbox WHERE $1::text IS NOT NULL",
                             work),
        # the outputs' tokens belong to the receiver that would consume them (nobody here)
        "output_tokens": ("WITH gone AS (DELETE FROM eo_token WHERE type = 'Deposited' "
                          "AND $1::text IS NOT NULL RETURNING 1) SELECT count(*) FROM gone",
                          work),
    }
    return {name: int(await admin.fetchval(query, arg))
            for name, (query, arg) in queries.items()}
