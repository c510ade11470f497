"""Protocol 11 in real processes: `eo consume --endpoint shipping` (tests/support/
shipping_service.py) on PostgreSQL and RabbitMQ calling a fake third-party API in a process
of its own (tools/fake_provider.py: Stripe-like idempotency keys) over HTTP. The
failure table's rows for it: a crash after the provider answered, two consumer processes
with copies of one follow-up, a provider failing then slow, a window that expired, a losing
attempt of the original message. In every row the provider executes the call once (or not
at all), and the order's state holds its one answer."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import MappingProxyType

import asyncpg
import pytest
from aio_pika.abc import AbstractIncomingMessage

from adapters.postgres.token_store import PostgresTokenStore
from adapters.rabbitmq import topology
from application.codec import encode
from application.envelope import REASON_HEADER, TOKEN_HEADER, Envelope
from entrypoints.faults import CRASH_EXIT
from tests.support.processes import (
    Fleet,
    Proc,
    Rabbit,
    Where,
    fresh_fleet,
    states,
    until,
    where_for,
)
from tests.support.shipping import Ship, Shipment
from tests.support.shipping_service import SPEC
from tools.fake_provider import FakeProvider, fake_provider

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

ENDPOINTS = ("shipping",)


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with where_for("eo_it_apis", "eo-it-apis") as found:
        yield found


@pytest.fixture
async def fleet(where: Where, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with fresh_fleet(where, tmp_path, service=SPEC, endpoints=ENDPOINTS) as started:
        yield started


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[FakeProvider]:
    with fake_provider(tmp_path / "provider.log") as started:
        yield started


def _consumer(fleet: Fleet, provider: FakeProvider, **env: str | None) -> Proc:
    return fleet.start("shipping", EO_APIS__CARRIER__URL=provider.url, **env)


async def _ship(rabbit: Rabbit, pool: asyncpg.Pool, order: str) -> uuid.UUID:
    """A token-path sender's `Ship`: its token, then its delivery."""
    envelope = Envelope(uuid.uuid4(), "Ship", encode(Ship(order, 1500)),
                        MappingProxyType({TOKEN_HEADER: "1"}))
    await PostgresTokenStore(pool).create("shipping", [envelope])
    await rabbit.publish("shipping", envelope.body, envelope.id_text, envelope.type,
                         dict(envelope.headers))
    return envelope.message_id


async def _answered(pool: asyncpg.Pool, order: str) -> Shipment | None:
    state = (await states(pool, "shipping", Shipment)).get(order)
    return state if state is not None and state.status is not None else None


async def _follow_ups(pool: asyncpg.Pool) -> list[str]:
    """The IDs of the `Booked` follow-ups whose tokens exist (committed, not consumed)."""
    rows = await pool.fetch("SELECT message_id FROM eo_token WHERE endpoint = 'shipping' "
                            "AND type = 'Booked'")
    return [str(r["message_id"]) for r in rows]


async def _one_execution(provider: FakeProvider, pool: asyncpg.Pool, order: str,
                         fleet: Fleet, rabbit: Rabbit) -> Shipment:
    async def done() -> bool:
        return await _answered(pool, order) is not None and not await _follow_ups(pool)

    await until(done, 60, f"{order}'s answer committed", fleet, rabbit, ENDPOINTS)
    state = await _answered(pool, order)
    assert state is not None
    assert state.answers == 1
    executions = (await asyncio.to_thread(provider.stats))["executions"]
    assert list(executions.values()) == [1], executions
    [key] = executions
    assert state.shipment_id == str(uuid.uuid5(uuid.NAMESPACE_URL, key))
    return state


async def test_a_crash_after_the_answer_gets_the_stored_answer_on_redelivery(
        fleet: Fleet, provider: FakeProvider, rabbit: Rabbit, pool: asyncpg.Pool) -> None:
    crashing = _consumer(fleet, provider, EO_FAILPOINTS="after_api_call=crash")
    await fleet.ready(crashing)
    await _ship(rabbit, pool, "o-crash")
    assert await fleet.exit_code(crashing, 60) == CRASH_EXIT
    assert (await asyncio.to_thread(provider.stats))["requests"] == 1
    assert await _answered(pool, "o-crash") is None  # answered, not committed
    await fleet.ready(_consumer(fleet, provider))
    await _one_execution(provider, pool, "o-crash", fleet, rabbit)
    assert (await asyncio.to_thread(provider.stats))["requests"] == 2


async def test_copies_of_a_follow_up_on_two_processes_execute_once(
        fleet: Fleet, provider: FakeProvider, rabbit: Rabbit, pool: asyncpg.Pool) -> None:
    await asyncio.to_thread(provider.faults, 0, 1.5)  # slow enough for both to send
    consumers = [_consumer(fleet, provider), _consumer(fleet, provider)]
    await fleet.ready(*consumers)
    await _ship(rabbit, pool, "o-copies")

    async def committed_follow_up() -> bool:
        return bool(await _follow_ups(pool))

    await until(committed_follow_up, 30, "the follow-up committed", fleet, rabbit, ENDPOINTS)
    [follow_up] = await _follow_ups(pool)
    row = await pool.fetchrow("SELECT type, body, headers FROM eo_token WHERE message_id = $1",
                              uuid.UUID(follow_up))
    for _ in range(3):  # copies, as a redelivery or a producer's retry would make
        await rabbit.publish("shipping", bytes(row["body"]), follow_up, row["type"],
                             dict(row["headers"]))
    await _one_execution(provider, pool, "o-copies", fleet, rabbit)
    assert (await asyncio.to_thread(provider.stats))["requests"] >= 2


async def test_a_failing_then_slow_provider_executes_once(
        fleet: Fleet, provider: FakeProvider, rabbit: Rabbit, pool: asyncpg.Pool) -> None:
    await asyncio.to_thread(provider.faults, 2, 2.5)  # two 503s, then slower than the timeout
    consumer = _consumer(fleet, provider, EO_APIS__CARRIER__TIMEOUT_S="0.4")
    await fleet.ready(consumer)
    await _ship(rabbit, pool, "o-slow")
    await _one_execution(provider, pool, "o-slow", fleet, rabbit)
    answered = [e["status"] for p in fleet.procs for e in p.events("api.called")]
    assert answered[:2] == [503, 503]
    assert 409 in answered  # a try after the timeout met the first still running
    assert answered[-1] == 201


async def test_past_the_window_nothing_is_sent_and_the_follow_up_is_dead_lettered(
        fleet: Fleet, provider: FakeProvider, rabbit: Rabbit, pool: asyncpg.Pool) -> None:
    # the first consumer commits Ship (its follow-up carries a 1 s window) and dies right
    # after publishing the follow-up; the next comes too late to send it
    first = _consumer(fleet, provider, EO_APIS__CARRIER__KEY_RETENTION_S="1",
                      EO_FAILPOINTS="after_publish:1=crash")
    await fleet.ready(first)
    await _ship(rabbit, pool, "o-late")
    assert await fleet.exit_code(first, 60) == CRASH_EXIT
    await asyncio.sleep(1.2)
    await fleet.ready(_consumer(fleet, provider))
    dlq = topology.queue_names("shipping").dead_letter
    dead: list[AbstractIncomingMessage] = []

    async def dead_lettered() -> bool:
        dead.extend(await rabbit.take(dlq, 10))
        return bool(dead)

    await until(dead_lettered, 30, "the follow-up dead-lettered", fleet)
    await asyncio.sleep(1)  # a copy (the redelivered Ship's finish publishes it again)
    dead.extend(await rabbit.take(dlq, 10))
    assert len({letter.message_id for letter in dead}) == 1
    for letter in dead:
        assert "idempotency window expired" in str(letter.headers[REASON_HEADER])
    assert (await asyncio.to_thread(provider.stats))["requests"] == 0


async def test_a_losing_attempt_of_the_original_message_sends_nothing(
        fleet: Fleet, provider: FakeProvider, rabbit: Rabbit, pool: asyncpg.Pool) -> None:
    losing = _consumer(fleet, provider, EO_FAILPOINTS="before_commit=crash")
    await fleet.ready(losing)
    await _ship(rabbit, pool, "o-lost")
    assert await fleet.exit_code(losing, 60) == CRASH_EXIT
    assert (await asyncio.to_thread(provider.stats))["requests"] == 0
    await fleet.ready(_consumer(fleet, provider))
    await _one_execution(provider, pool, "o-lost", fleet, rabbit)
