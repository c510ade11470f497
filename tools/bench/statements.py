"""PostgreSQL CPU per message of the token path's statements, against the minimal consumer's:
`python -m tools.bench.statements [--messages N] [--partitions N] [--batch-size N]
[--database-dsn DSN]`.

`eo bench` measures whole consumers, where PostgreSQL's share of the CPU moves with the
machine's load. This isolates it: one connection runs, for `--messages` deposits over
`--partitions` accounts, the statements of

- `token`: the single co-located token path (load with the token, commit, clear),
- `token-batched`: the batched path, `--batch-size` messages per statement (`load_many`,
  `commit_many`, `clear_many`; the partitions of a batch are distinct),
- `minimal`, `minimal-batched`: the bench's references (`tools/bench/references.py`:
  inbox row, locked state, state, outbox row, outbox delete),

and reads the server process's own CPU time (user + system, with psutil, so the server
must run on this machine) around each statement: milliseconds per message, per step.
The incoming tokens are written before each step is timed, as a sender would. The
transaction records exist beforehand (no first-message inserts) and the tables have no
statistics, as on a server whose autovacuum has not run yet. A benchmark that prints
figures, never a test of speed; like `eo bench` it creates a database of its own on the server
of `--database-dsn` (named after the database that DSN names, which it never touches) and
drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import psutil

from adapters.postgres.admin import database_name
from adapters.postgres.migrate import upgrade_async
from adapters.postgres.pool import create_pool
from adapters.postgres.transactional_store import PostgresTransactionalStore
from adapters.system.clock import SystemClock
from application.codec import encode
from application.envelope import TOKEN_HEADER, Envelope
from application.ports import Clear, CommitRequest, Loaded
from application.records import Kind, SideEffectRecord
from application.side_effects import message_payload
from tools.bench import endpoint as bench
from tools.bench import references
from tools.bench.run import BENCH_DATABASE
from tools.bench.tables import truncate_tables
from tools.scratch import own_database

ENDPOINT, SINK = "bench-statements", "bench-statements-sink"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/eo_bench"  # `eo bench`'s


def server_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used (psutil, as `eo bench` reads
    them); `psutil.NoSuchProcess` when it is not on this machine."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


class _Meter:
    """CPU of one server process, summed per step (seconds)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.spent = pid, defaultdict[str, float](float)

    async def step(self, name: str, call: Any) -> Any:
        before = server_cpu_s(self.pid)
        result = await call
        self.spent[name] += server_cpu_s(self.pid) - before
        return result


def _deposit(account: str) -> bytes:
    return encode(bench.Deposit(account, 100, 1))


def _request(loaded: Loaded, incoming: uuid.UUID, account: str, now: datetime
             ) -> CommitRequest:
    """The commit the token path makes of a deposit: new state, one outgoing message whose
    token stands for its record (as `Preparation` builds it)."""
    attempt = uuid.uuid4()
    out = Envelope(uuid.uuid4(), "Deposited", _deposit(account),
                   MappingProxyType({TOKEN_HEADER: "1"}))
    record = SideEffectRecord(account, Kind.MESSAGE, str(out.message_id), incoming, attempt, 0,
                              message_payload(SINK, out), now, in_token=True)
    state = loaded.state or bench.Balance()
    return CommitRequest(account, loaded.tr.version, bench.Balance(state.cents + 100,
                                                                   state.count + 1),
                         incoming, attempt, (record,), tokens=((SINK, out),))


async def _token(pool: Any, meter: _Meter, accounts: list[str], batch_size: int) -> None:
    store = PostgresTransactionalStore(pool, ENDPOINT, bench.Balance, SystemClock(),
                                       holds_tokens=True)
    for start in range(0, len(accounts), batch_size):
        batch = accounts[start:start + batch_size]
        incoming = [uuid.uuid4() for _ in batch]
        await pool.executemany(
            "INSERT INTO eo_token (endpoint, message_id, type, body, headers) "
            "VALUES ($1, $2, 'Deposit', $3, $4)",
            [(ENDPOINT, m, _deposit(a), {TOKEN_HEADER: "1"}) for m, a in zip(incoming, batch,
                                                                              strict=True)])
        now, due = datetime.now(UTC), datetime.now(UTC) + timedelta(minutes=30)
        if batch_size == 1:
            [account], [m] = batch, incoming
            loaded = await meter.step("load", store.load(account, m))
            done = await meter.step("commit", store.commit(_request(loaded, m, account, now)))
            await meter.step("clear", store.clear(Clear(account, done.version, done.records,
                                                        (), due, m)))
            continue
        loads = await meter.step("load", store.load_many(batch, incoming))
        requests = [_request(x, m, a, now) for x, m, a in zip(loads, incoming, batch,
                                                                strict=True)]
        dones = await meter.step("commit", store.commit_many(requests))
        await meter.step("clear", store.clear_many([
            Clear(r.partition, d.version, d.records, (), due, r.message_id)
            for r, d in zip(requests, dones, strict=True) if d is not None]))


async def _minimal(pool: Any, meter: _Meter, accounts: list[str], batch_size: int) -> None:
    async def publish(message_id: uuid.UUID, body: bytes) -> None:
        """No broker here: only the database's work is measured."""

    for start in range(0, len(accounts), batch_size):
        batch = [(uuid.uuid4(), bench.Deposit(a, 100, 1))
                 for a in accounts[start:start + batch_size]]
        if batch_size == 1:
            await meter.step("all", references.process_one(pool, *batch[0], SINK, publish))
        else:
            await meter.step("all", references.process_many(pool, batch, SINK, publish))


async def _check(pool: Any, label: str, messages: int) -> None:
    """Raise RuntimeError unless every message was processed once: each deposit counted in
    its account's state, and (token paths) every incoming token consumed, no transaction
    left committed."""
    if label.startswith("token"):
        counted = await pool.fetchval(
            "SELECT coalesce(sum((state->>'count')::int), 0) FROM eo_transaction_record "
            "WHERE endpoint = $1", ENDPOINT)
        left = await pool.fetchval(
            "SELECT (SELECT count(*) FROM eo_token WHERE endpoint = $1) + (SELECT count(*) "
            "FROM eo_transaction_record WHERE endpoint = $1 AND message_id IS NOT NULL)",
            ENDPOINT)
    else:
        counted = await pool.fetchval(
            "SELECT coalesce(sum((state->>'count')::int), 0) FROM bench_state")
        left = await pool.fetchval("SELECT count(*) FROM bench_outbox")
    if counted != messages or left:
        raise RuntimeError(f"{label}: {counted} of {messages} deposits counted, {left} tokens, "
                           "unfinished transactions or outbox rows left")


async def measure(dsn: str, messages: int, partitions: int, batch_size: int
                  ) -> dict[str, dict[str, float]]:
    """{configuration: {step: server CPU ms per message, ..., "total": ...}} for `token`,
    `token-batched`, `minimal`, `minimal-batched` (see the module docstring), on a database
    of its own created on the server of `dsn` and dropped at the end. Raises RuntimeError
    when a configuration miscounts, `psutil.NoSuchProcess` when the server runs on another
    machine, asyncpg's errors when the server refuses."""
    async with own_database(dsn, database_name(dsn) or BENCH_DATABASE) as own:
        return await _measure(own, messages, partitions, batch_size)


async def _measure(dsn: str, messages: int, partitions: int, batch_size: int
                   ) -> dict[str, dict[str, float]]:
    await upgrade_async(dsn)
    # one server process to read, kept for the whole run (never replaced after N queries)
    pool = await create_pool(dsn, min_size=1, max_size=1, max_queries=2**31 - 1)
    try:
        for statement in references.SCHEMA:
            await pool.execute(statement)
        pid = await pool.fetchval("SELECT pg_backend_pid()")
        server_cpu_s(pid)
        names = [f"acct-{i}" for i in range(partitions)]
        accounts = [names[i % partitions] for i in range(messages)]
        results = {}
        for label, run, size in (("token", _token, 1), ("token-batched", _token, batch_size),
                                 ("minimal", _minimal, 1),
                                 ("minimal-batched", _minimal, batch_size)):
            await truncate_tables(pool)
            await pool.execute(  # every account's row exists, as after a first message
                "INSERT INTO eo_transaction_record (endpoint, partition_key) "
                "SELECT $1, unnest($2::text[])", ENDPOINT, names)
            await pool.execute("INSERT INTO bench_state (account) SELECT unnest($1::text[])",
                               names)
            meter = _Meter(pid)
            await run(pool, meter, accounts, size)
            await _check(pool, label, messages)
            figures = {k: 1000 * v / messages for k, v in meter.spent.items()}
            results[label] = {**figures, "total": sum(figures.values())}
        return results
    finally:
        await pool.close()


def main() -> None:
    """Print the server CPU per message of each configuration (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=6000)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=30)
    parser.add_argument("--database-dsn", default=DEFAULT_DSN)
    options = parser.parse_args()
    results = asyncio.run(measure(options.database_dsn, options.messages, options.partitions,
                                  options.batch_size))
    print(f"PostgreSQL CPU, ms per message ({options.messages} messages, "
          f"{options.partitions} partitions, batches of {options.batch_size}):")
    for label, figures in results.items():
        steps = ", ".join(f"{k} {v:.3f}" for k, v in figures.items() if k != "total")
        print(f"  {label:16} {figures['total']:.3f}  ({steps})")


if __name__ == "__main__":
    main()
