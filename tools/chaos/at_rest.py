"""What the chaos tests and `eo chaos` check in the stores and on the broker at quiescence
(the processes' logs: tools/chaos/checks.py).

From the stores at rest (after the final sweep): I8/I9 — no token in flight, no
committed-but-unfinished transaction records, no side-effect records, no deferred clean-up
past its grace, no HTTP requests left on a callee, no gateway inbox row waiting to be
relayed. What the protocol keeps on purpose is counted apart, as `eo inspect` does: the
token a dead letter keeps for its replay, a deferred clean-up within its grace. I10 — every
queue drained; dead letters are counted per endpoint (one per message), with reasons.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import aio_pika
import asyncpg

from adapters.postgres.dead_letter_store import PostgresDeadLetterStore
from adapters.postgres.token_store import PostgresTokenStore
from adapters.rabbitmq import topology
from adapters.rabbitmq.urls import connect_first
from adapters.system.clock import SystemClock
from application.envelope import REASON_HEADER

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


async def dead_letters(amqp_url: str | Sequence[str], endpoints: Sequence[str],
                       peek: bool = True, database_dsn: str | None = None) -> DeadLetters:
    """Count each endpoint's dead-letter queue (`<endpoint>.dlq`) on the broker at
    `amqp_url` and, with `database_dsn`, the dead letters its consumers moved into the
    dead-letter store (`eo_dead_letter`, those waiting for an operator); with `peek`, also
    read their reasons (messages go back to the queue). A queue that does not exist counts
    0. Raises aio_pika's connection errors and asyncpg's."""
    counts: dict[str, int] = {}
    reasons: dict[str, list[str]] = {}
    connection = await connect_first(amqp_url)
    try:
        for endpoint in endpoints:
            name = topology.queue_names(endpoint).dead_letter
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


async def queue_depth(amqp_url: str | Sequence[str], endpoints: Sequence[str],
                      retry_delays_s: Sequence[float]) -> int:
    """Messages waiting in the work and retry queues of `endpoints` (dead-letter queues
    excluded): 0 is one condition of quiescence. A missing queue counts 0."""
    total = 0
    connection = await connect_first(amqp_url)
    try:
        for endpoint in endpoints:
            names = topology.queue_names(endpoint, retry_delays_s)
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
