"""What the chaos tests and `eo chaos` check at quiescence, beyond the sample's oracle
(tools/tpch/oracle.py): the protocol's invariants (protocol 1) as far as the
processes' logs and the stores at rest can show them.

From the JSON logs of every process (killed ones included):
- every protocol event (`message.received`, `handler.invoked`, `transaction.committed`,
  `side_effect.published`) names its endpoint and message ID: one that does not cannot be
  checked, and is reported rather than skipped.
- I1: at most one `transaction.committed` per (endpoint, message ID). A process killed between
  its commit and the log line leaves the commit unlogged, so the logs give a lower bound: a
  second logged commit is a violation, a missing one is not (the oracle sees the state).
- I2: every received copy of a message ID has the same body (`message.received` logs the
  body's SHA-256 prefix, and a copy logged without it is a violation).
- I3: where a message's commit is logged, every side effect published for it names the
  committed attempt (output of another attempt would not match the committed state).
- I7: every `side_effect.published` of one incoming message names one attempt.
- Handler re-runs (`rerun_violations`): every attempt beyond the committed one was aborted
  visibly: a conflict, a delayed retry, or the death of its process by plan (only the attempt
  in progress when it died).

From the stores at rest (after the final sweep): I8/I9 — no token in flight, no
committed-but-unfinished transaction records, no side-effect records, no deferred clean-up
past its grace, no HTTP requests left on a callee, no gateway inbox row waiting to be
relayed. What the protocol keeps on purpose is counted apart, as `eo inspect` does: the
token a dead letter keeps for its replay, a deferred clean-up within its grace. I10 — every
queue drained; dead letters are counted per endpoint (one per message), with reasons.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from adapters.postgres.dead_letter_store import PostgresDeadLetterStore
from adapters.postgres.token_store import PostgresTokenStore
from adapters.rabbitmq import topology
from adapters.system.clock import SystemClock
from application.envelope import REASON_HEADER
from application.observability import (
    ATTEMPT_ABANDONED,
    HANDLER_INVOKED,
    MESSAGE_DEAD_LETTERED,
    MESSAGE_RECEIVED,
    MESSAGE_RETRIED,
    SETTLEMENT_FAILED,
    SIDE_EFFECT_PUBLISHED,
    TRANSACTION_COMMITTED,
    TRANSACTION_CONFLICT,
)

#: The tokens: `at_rest` counts those in flight, every token but those dead letters keep
#: (`kept_tokens`).
_TOKENS = "tokens in flight"
#: SQL counting what must be gone at rest (name -> query): what `eo inspect` shows, less the
#: protocol's own states at rest (`KEPT`).
AT_REST: dict[str, str] = {
    _TOKENS: "SELECT count(*) FROM eo_token",
    "unfinished transaction records":
        "SELECT count(*) FROM eo_transaction_record WHERE message_id IS NOT NULL",
    "side-effect records": "SELECT count(*) FROM eo_side_effect_record",
    "deferred clean-ups past their grace":
        "SELECT count(*) FROM eo_deferred_cleanup WHERE due <= now()",
    "requests on callees": "SELECT count(*) FROM eo_http_request",
    "unrelayed inbox rows": "SELECT count(*) FROM eo_inbox WHERE relayed_at IS NULL",
}
#: SQL counting what the protocol keeps at rest on purpose (name -> query): the tokens dead
#: letters keep for their replay, and deferred clean-ups still within their grace (protocol
#: 8: an aborted attempt's artifact waits for it before it is deleted).
KEPT: dict[str, str] = {
    "deferred clean-ups within their grace":
        "SELECT count(*) FROM eo_deferred_cleanup WHERE due > now()",
}
#: The events the log audit attributes to (endpoint, message ID).
PROTOCOL_EVENTS = frozenset({MESSAGE_RECEIVED, HANDLER_INVOKED, TRANSACTION_COMMITTED,
                             SIDE_EFFECT_PUBLISHED, ATTEMPT_ABANDONED})
#: At most this many violations are listed per invariant (the rest are counted).
MAX_LISTED = 10


def read_logs(log_dir: Path, pattern: str = "*.jsonl") -> list[dict[str, Any]]:
    """Every JSON line of the logs in `log_dir` (lines that are not JSON objects, e.g. a
    traceback or a line cut by SIGKILL, are skipped). Order: file by file, line by line."""
    records: list[dict[str, Any]] = []
    for path in sorted(log_dir.glob(pattern)):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # the last line of a killed process may be cut short
    return records


@dataclass
class LogAudit:
    """The log-based checks' result: `violations` (empty when I1, I2 and I7 hold) and per
    (endpoint, message ID) counts of handler runs, logged commits and received copies.
    `handler_runs` leaves out the runs a batch abandoned (`abandoned`: it ran the handler,
    then left the message to the single path before anything was durable)."""

    violations: list[str] = field(default_factory=list)
    handler_runs: Counter[tuple[str, str]] = field(default_factory=Counter)
    abandoned: Counter[tuple[str, str]] = field(default_factory=Counter)
    commits: Counter[tuple[str, str]] = field(default_factory=Counter)
    received: Counter[tuple[str, str]] = field(default_factory=Counter)

    def runs(self, endpoint: str, message_id: object) -> int:
        """Handler runs logged for `message_id` at `endpoint`."""
        return self.handler_runs[(endpoint, str(message_id))]


def audit_logs(records: Iterable[dict[str, Any]]) -> LogAudit:
    """Check I1, I2 and I7 on the processes' log `records` (see the module docstring)."""
    audit = LogAudit()
    digests: dict[tuple[str, str], set[str]] = defaultdict(set)
    publishers: dict[tuple[str, str], set[str]] = defaultdict(set)
    committers: dict[tuple[str, str], set[str]] = defaultdict(set)
    unattributed: list[str] = []
    undigested: list[str] = []
    for record in records:
        event = record.get("event")
        if event not in PROTOCOL_EVENTS:
            continue
        endpoint, message_id = record.get("endpoint"), record.get("message_id")
        if not endpoint or not message_id:
            missing = [what for what, value in (("an endpoint", endpoint),
                                                ("a message ID", message_id)) if not value]
            unattributed.append(f"{event} without {' or '.join(missing)}: {record}")
            continue
        key = (str(endpoint), str(message_id))
        if event == MESSAGE_RECEIVED:
            audit.received[key] += 1
            if record.get("body_sha256"):
                digests[key].add(str(record["body_sha256"]))
            else:
                undigested.append(f"{key[0]} received {key[1]} without a body digest")
        elif event == HANDLER_INVOKED:
            audit.handler_runs[key] += 1
        elif event == ATTEMPT_ABANDONED:
            audit.handler_runs[key] -= 1
            audit.abandoned[key] += 1
        elif event == TRANSACTION_COMMITTED:
            audit.commits[key] += 1
            committers[key].add(str(record.get("attempt_id")))
        elif event == SIDE_EFFECT_PUBLISHED:
            publishers[key].add(str(record.get("attempt_id")))
    _report(audit, "unattributed", unattributed)
    _report(audit, "I1", (f"{e} committed {m} {n} times"
                          for (e, m), n in sorted(audit.commits.items()) if n > 1))
    _report(audit, "I2", undigested)
    _report(audit, "I2", (f"{e} received {len(d)} different bodies for {m}"
                          for (e, m), d in sorted(digests.items()) if len(d) > 1))
    _report(audit, "I3", (f"{e} published side effects of {m} from attempt(s) "
                          f"{sorted(a - committers[(e, m)])}, not the committed "
                          f"{sorted(committers[(e, m)])}"
                          for (e, m), a in sorted(publishers.items())
                          if committers.get((e, m)) and a - committers[(e, m)]))
    _report(audit, "I7", (f"{e} published side effects of {m} from {len(a)} attempts"
                          for (e, m), a in sorted(publishers.items()) if len(a) > 1))
    return audit


def crashed_by_failpoint(log: Path) -> bool:
    """Whether the process log `log` ends a life ended by a `crash` failpoint: the line
    `failpoint <name>: crash` it writes on stderr before exiting (entrypoints/faults.py)."""
    if not log.exists():
        return False
    return any(re.fullmatch(r"failpoint \S+: crash", line)
               for line in log.read_text(errors="replace").splitlines())


def open_attempts(log: Iterable[Mapping[str, Any]]) -> list[tuple[tuple[str, str], str]]:
    """((endpoint, message ID), attempt ID) of every attempt one process's `log` started
    (`handler.invoked`) and did not end: no `transaction.committed` or `attempt.abandoned`
    of that attempt, no `transaction.conflict`, `message.retried` or
    `message.dead_lettered` of its message after it. In log order."""
    pending: dict[str, tuple[str, str]] = {}
    for r in log:
        event, attempt = r.get("event"), str(r.get("attempt_id"))
        key = (str(r.get("endpoint")), str(r.get("message_id")))
        if event == HANDLER_INVOKED:
            pending[attempt] = key
        elif event in (TRANSACTION_COMMITTED, ATTEMPT_ABANDONED):
            pending.pop(attempt, None)
        elif event in (TRANSACTION_CONFLICT, MESSAGE_RETRIED, MESSAGE_DEAD_LETTERED) or (
                event == SETTLEMENT_FAILED and r.get("settlement") in ("retry", "dead_letter")):
            pending = {a: k for a, k in pending.items() if k != key}
    return [(key, attempt) for attempt, key in pending.items()]


def rerun_violations(records: Iterable[Mapping[str, Any]],
                     deaths: Iterable[Sequence[Mapping[str, Any]]]) -> list[str]:
    """Handler runs protocol 3.4 does not allow, from every process's log `records`: at most
    one attempt of a message commits, and every other attempt was aborted visibly, by a
    `transaction.conflict`, `message.retried`, `attempt.abandoned` or `message.dead_lettered`
    of that message, a
    `message.settlement_failed` of its retry or dead letter (the connection was lost: the
    broker redelivers it), or by a planned death.

    `deaths`: the log records of each process that died *by plan* (a `crash` failpoint's
    exit, a SIGKILL the harness sent); of each, only the attempts in progress when it died
    count as aborted: those it started (`handler.invoked`) and did not end in its log (no
    commit or abandon of that attempt, no conflict, retry or dead letter of its message
    after it). A batch has many in progress at once. An exit nobody planned excuses
    nothing. Returns one line per message in violation."""
    attempts: dict[tuple[str, str], set[str]] = defaultdict(set)
    committed: dict[tuple[str, str], set[str]] = defaultdict(set)
    aborts: Counter[tuple[str, str]] = Counter()
    for r in records:
        key = (str(r.get("endpoint")), str(r.get("message_id")))
        event = r.get("event")
        if event == HANDLER_INVOKED:
            attempts[key].add(str(r.get("attempt_id")))
        elif event == TRANSACTION_COMMITTED:
            committed[key].add(str(r.get("attempt_id")))
        elif event in (TRANSACTION_CONFLICT, MESSAGE_RETRIED, ATTEMPT_ABANDONED,
                       MESSAGE_DEAD_LETTERED):
            aborts[key] += 1  # (a dead letter: the attempt ended visibly, never to commit)
        elif event == SETTLEMENT_FAILED and r.get("settlement") in ("retry", "dead_letter"):
            aborts[key] += 1  # its retry could not be published: the broker redelivers it
    for log in deaths:
        for key, attempt in open_attempts(log):
            if attempt not in committed[key]:
                aborts[key] += 1
    problems = []
    for key, ids in sorted(attempts.items()):
        wins = committed.get(key, set())
        if len(wins) > 1:
            problems.append(f"{key}: {len(wins)} attempts committed")
        extra = len(ids) - len(wins & ids)
        if extra > aborts[key]:
            problems.append(f"{key}: {len(ids)} handler runs, {len(wins)} committed, only "
                            f"{aborts[key]} visible aborts (conflict, retry, planned death)")
    return problems


def _report(audit: LogAudit, invariant: str, found: Iterable[str]) -> None:
    items = list(found)
    audit.violations += [f"{invariant}: {text}" for text in items[:MAX_LISTED]]
    if len(items) > MAX_LISTED:
        audit.violations.append(f"{invariant}: ... {len(items) - MAX_LISTED} more")


async def kept_tokens(pool: asyncpg.Pool) -> int:
    """The tokens that dead letters waiting for an operator keep for their replay, counted as
    `eo inspect` counts them (`DeadLetters.gauges`: the store's waiting letters, the token
    store's `count_of`)."""
    waiting = await PostgresDeadLetterStore(pool, SystemClock()).waiting()
    return await PostgresTokenStore(pool).count_of(waiting)


async def at_rest(pool: asyncpg.Pool) -> dict[str, int]:
    """What is left in the protocol's tables (`AT_REST`, tokens less `kept_tokens`): all
    zero at quiescence after the final sweep (I8, I9; a committed-but-unfinished record
    would break I5)."""
    found = {name: int(await pool.fetchval(sql)) for name, sql in AT_REST.items()}
    found[_TOKENS] -= await kept_tokens(pool)
    return found


async def kept_at_rest(pool: asyncpg.Pool) -> dict[str, int]:
    """What the protocol keeps at rest on purpose (`kept_tokens`, `KEPT`): not a violation,
    reported."""
    return {"tokens kept by dead letters": await kept_tokens(pool),
            **{name: int(await pool.fetchval(sql)) for name, sql in KEPT.items()}}


@dataclass(frozen=True)
class DeadLetters:
    """Dead letters per endpoint and their reasons (`eo-reason` header), read without
    consuming them (each message is fetched, then rejected back to its queue)."""

    counts: dict[str, int]
    reasons: dict[str, list[str]]

    @property
    def total(self) -> int:
        """Dead letters over all endpoints."""
        return sum(self.counts.values())


async def dead_letters(amqp_url: str, endpoints: Sequence[str],
                       peek: bool = True, database_dsn: str | None = None) -> DeadLetters:
    """Count each endpoint's dead-letter queue (`<endpoint>.dlq`) on the broker at
    `amqp_url` and, with `database_dsn`, the dead letters its consumers moved into the
    dead-letter store (`eo_dead_letter`, those waiting for an operator); with `peek`, also
    read their reasons (messages go back to the queue). A queue that does not exist counts
    0. Raises aio_pika's connection errors and asyncpg's."""
    counts: dict[str, int] = {}
    reasons: dict[str, list[str]] = {}
    connection = await aio_pika.connect(amqp_url)
    try:
        for endpoint in endpoints:
            name = topology.queue_names(endpoint, 1).dead_letter
            channel = await connection.channel()
            try:
                queue = await channel.declare_queue(name, passive=True)
            except aio_pika.exceptions.ChannelClosed:
                counts[endpoint], reasons[endpoint] = 0, []
                continue
            counts[endpoint] = queue.declaration_result.message_count or 0
            reasons[endpoint] = []
            if peek and counts[endpoint]:
                held = []
                for _ in range(counts[endpoint]):
                    message = await queue.get(no_ack=False, fail=False)
                    if message is None:
                        break
                    held.append(message)
                    reasons[endpoint].append(str(message.headers.get(REASON_HEADER, "")))
                for message in held:
                    await message.nack(requeue=True)
            await channel.close()
    finally:
        await connection.close()
    if database_dsn is not None:
        conn = await asyncpg.connect(database_dsn)
        try:
            rows = await conn.fetch(
                "SELECT endpoint, reasons->-1->>'reason' AS reason FROM eo_dead_letter "
                "WHERE status = 'dead' AND endpoint = ANY($1::text[])", list(endpoints))
        finally:
            await conn.close()
        for row in rows:
            counts[row["endpoint"]] = counts.get(row["endpoint"], 0) + 1
            if peek:
                reasons.setdefault(row["endpoint"], []).append(str(row["reason"]))
    return DeadLetters(counts, reasons)


async def queue_depth(amqp_url: str, endpoints: Sequence[str], retry_queues: int) -> int:
    """Messages waiting in the work and retry queues of `endpoints` (dead-letter queues
    excluded): 0 is one condition of quiescence. A missing queue counts 0."""
    total = 0
    connection = await aio_pika.connect(amqp_url)
    try:
        for endpoint in endpoints:
            names = topology.queue_names(endpoint, retry_queues)
            for name in (names.work, *names.retries):
                channel = await connection.channel()
                try:
                    queue = await channel.declare_queue(name, passive=True)
                    total += queue.declaration_result.message_count or 0
                    await channel.close()
                except aio_pika.exceptions.ChannelClosed:
                    continue
    finally:
        await connection.close()
    return total
