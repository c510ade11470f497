"""What the chaos tests and `eo chaos` check at quiescence, beyond the sample's oracle
(tools/tpch/oracle.py): the protocol's invariants (protocol 1) as far as the
processes' logs and the stores at rest can show them.

From the JSON logs of every process (killed ones included):
- I1: at most one `transaction.committed` per (endpoint, message ID). A process killed between
  its commit and the log line leaves the commit unlogged, so the logs give a lower bound: a
  second logged commit is a violation, a missing one is not (the oracle sees the state).
- I2: every received copy of a message ID has the same body (`message.received` logs the
  body's SHA-256 prefix).
- I7: every `side_effect.published` of one incoming message names one attempt.

From the stores at rest (after the final sweep): I8/I9 — no tokens, no committed-but-unfinished
transaction records, no side-effect records, no deferred clean-ups, no HTTP requests left on
the callee, no gateway inbox row waiting to be relayed. I10 — every queue drained; dead
letters are counted per endpoint, with reasons.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from adapters.rabbitmq import topology
from application.envelope import REASON_HEADER
from application.observability import (
    HANDLER_INVOKED,
    MESSAGE_RECEIVED,
    SIDE_EFFECT_PUBLISHED,
    TRANSACTION_COMMITTED,
)

#: SQL counting what must be gone at rest (name -> query).
AT_REST: dict[str, str] = {
    "tokens": "SELECT count(*) FROM eo_token",
    "unfinished transaction records":
        "SELECT count(*) FROM eo_transaction_record WHERE message_id IS NOT NULL",
    "side-effect records": "SELECT count(*) FROM eo_side_effect_record",
    "aborted artifacts (deferred clean-ups)": "SELECT count(*) FROM eo_deferred_cleanup",
    "requests on payments": "SELECT count(*) FROM eo_http_request",
    "unrelayed inbox rows": "SELECT count(*) FROM eo_inbox WHERE relayed_at IS NULL",
}
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
    (endpoint, message ID) counts of handler runs, logged commits and received copies."""

    violations: list[str] = field(default_factory=list)
    handler_runs: Counter[tuple[str, str]] = field(default_factory=Counter)
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
    for record in records:
        event = record.get("event")
        key = (str(record.get("endpoint", "")), str(record.get("message_id", "")))
        if event == MESSAGE_RECEIVED:
            audit.received[key] += 1
            if "body_sha256" in record:
                digests[key].add(str(record["body_sha256"]))
        elif event == HANDLER_INVOKED:
            audit.handler_runs[key] += 1
        elif event == TRANSACTION_COMMITTED:
            audit.commits[key] += 1
        elif event == SIDE_EFFECT_PUBLISHED:
            publishers[key].add(str(record.get("attempt_id")))
    _report(audit, "I1", (f"{e} committed {m} {n} times"
                          for (e, m), n in sorted(audit.commits.items()) if n > 1))
    _report(audit, "I2", (f"{e} received {len(d)} different bodies for {m}"
                          for (e, m), d in sorted(digests.items()) if len(d) > 1))
    _report(audit, "I7", (f"{e} published side effects of {m} from {len(a)} attempts"
                          for (e, m), a in sorted(publishers.items()) if len(a) > 1))
    return audit


def _report(audit: LogAudit, invariant: str, found: Iterable[str]) -> None:
    items = list(found)
    audit.violations += [f"{invariant}: {text}" for text in items[:MAX_LISTED]]
    if len(items) > MAX_LISTED:
        audit.violations.append(f"{invariant}: ... {len(items) - MAX_LISTED} more")


async def at_rest(pool: asyncpg.Pool) -> dict[str, int]:
    """What is left in the protocol's tables (`AT_REST`): all zero at quiescence after the
    final sweep (I8, I9; a committed-but-unfinished record would break I5)."""
    return {name: int(await pool.fetchval(sql)) for name, sql in AT_REST.items()}


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
                       peek: bool = True) -> DeadLetters:
    """Count each endpoint's dead-letter queue (`<endpoint>.dlq`) on the broker at
    `amqp_url`; with `peek`, also read their `eo-reason` headers (messages go back to the
    queue). A queue that does not exist counts 0. Raises aio_pika's connection errors."""
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
