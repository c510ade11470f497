"""The gateway's inbox relay on a real PostgreSQL and RabbitMQ, on the counters' `front`.

Inbox rows reach the `counter` queue exactly once (one message ID and one token per command,
every copy identical) even when the relay crashes between publish and marking; and the
`eo consume --endpoint front` process relays its inbox.

A database (`eo_it_inbox_relay_<pid>`) and, where `rabbitmqctl` works, a RabbitMQ virtual
host of this module's own keep its fixed queue names away from other users and runs.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from pydantic import SecretStr

from adapters.rabbitmq import topology
from adapters.rabbitmq.consumer import RabbitSource
from application.codec import encode
from application.envelope import Envelope
from application.errors import Crash
from application.inbox_relay import InboxRelay
from application.observability import INBOX_RELAYED, TRANSACTION_COMMITTED
from application.ports import Inbox, InboxClaim
from application.workers import Workers
from entrypoints.local import LocalContainer
from entrypoints.settings import Settings, load_settings, resolve_service
from tests.support.counters.endpoints import Add
from tests.support.counters.registry import SPEC
from tests.support.processes import (
    Fleet,
    Rabbit,
    Where,
    publisher,
    reset,
    where_for,
)

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

DELAYS = (0.05, 0.1)
QUEUES = ("front", "counter")


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with where_for("eo_it_inbox_relay", "eo-it-inbox-relay") as found:
        yield found


@pytest.fixture(scope="module")
def commands() -> list[Envelope]:
    """A batch producer's `Add` commands for four counters, each amount a distinct power of
    two per counter, under natural message IDs (a re-run yields the same IDs)."""
    adds = [Add(f"k{k}", 2 ** i) for k in range(4) for i in range(8)]
    return [Envelope(uuid.uuid5(uuid.NAMESPACE_URL, f"Add/{a.counter}/{a.amount}"), "Add",
                     encode(a)) for a in adds]


def _settings(where: Where, tmp_path: Path) -> Settings:
    return load_settings(service=SPEC, profile="local", database_dsn=SecretStr(where.dsn),
                         amqp_url=SecretStr(where.amqp_url), retry_delays_s=DELAYS,
                         pool_size=2, metrics_port=0, blob_store="directory",
                         blob_dir=tmp_path / "blobs", inbox_batch=10)


@asynccontextmanager
async def _system(where: Where, tmp_path: Path) -> AsyncIterator[tuple[LocalContainer, Workers]]:
    """The counters on the local profile's adapters (the container's resources started)."""
    settings = _settings(where, tmp_path)
    container = LocalContainer(settings=settings, service=resolve_service(settings))
    await container.init_resources()  # type: ignore[misc]
    try:
        yield container, await container.workers()  # type: ignore[misc]
    finally:
        await container.shutdown_resources()  # type: ignore[misc]


async def _reset(where: Where, rabbit: Rabbit) -> None:
    await reset(where, DELAYS, QUEUES)
    for endpoint in QUEUES:
        await topology.declare(rabbit, endpoint, DELAYS, 20)


async def _drain_queue(rabbit: Rabbit, queue: str) -> list[Envelope]:
    """Every message of `queue`, taken off it."""
    return [Envelope(uuid.UUID(m.message_id or ""), m.type or "", m.body)
            for m in await rabbit.take(queue, 100_000)]


async def _count(where: Where, sql: str) -> int:
    conn = await asyncpg.connect(where.dsn)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


async def _until(condition: Callable[[], Awaitable[bool]], timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s / 0.1)):
        if await condition():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not reached within {timeout_s} s")


class _CrashingInbox:
    """`inbox` whose claims crash right after the relay marked its rows: the relay process
    dies between publish and the commit of its marks."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox

    def claim(self, limit: int) -> AbstractAsyncContextManager[InboxClaim]:
        @asynccontextmanager
        async def crashing() -> AsyncIterator[InboxClaim]:
            async with self.inbox.claim(limit) as claim:

                class Marking:
                    envelopes = claim.envelopes

                    async def mark_relayed(self, rows: Sequence[Envelope]) -> None:
                        await claim.mark_relayed(rows)
                        raise Crash("killed before the claim committed its marks")

                yield Marking()

        return crashing()


async def _relay_crash_then_gateway(where: Where, tmp_path: Path, commands: list[Envelope]
                                    ) -> tuple[dict[Any, int], list[Envelope], int, int]:
    async with publisher(where) as rabbit, _system(where, tmp_path) as (container, system):
        await _reset(where, rabbit)
        inbox = system.inboxes["front"]
        n = len(commands)
        assert await inbox.add(commands) == n
        assert await inbox.add(commands) == 0  # a re-run producer adds nothing
        crashing = InboxRelay("front", _CrashingInbox(inbox),  # type: ignore[arg-type]
                              system.dispatcher, system.events, batch_size=n)
        with pytest.raises(Crash):
            await crashing.relay_once()
        assert await rabbit.depth("front") == n  # published and confirmed ...
        assert await inbox.count_pending() == n  # ... but the marks rolled back
        assert await system.relay("front").drain() == n  # the restarted relay: every row again
        assert await inbox.count_pending() == 0
        assert await system.relay("front").drain() == 0
        assert await rabbit.depth("front") == 2 * n

        source = RabbitSource(await container.rabbit(), "front", DELAYS,  # type: ignore[misc]
                              events=system.events)
        consumer = system.consumer("front")
        serving = asyncio.create_task(consumer.serve(source.deliveries(8), 8))

        async def settled() -> bool:
            return sum(consumer.counts.values()) >= 2 * n

        await _until(settled)
        await source.stop()
        await serving
        tokens = await system.tokens.count()
        processed = await _count(where, "SELECT count(*) FROM eo_processed_message "
                                        "WHERE endpoint = 'front'")
        return dict(consumer.counts), await _drain_queue(rabbit, "counter"), tokens, processed


def test_inbox_rows_reach_the_counter_exactly_once_despite_a_relay_crash(
    where: Where, tmp_path: Path, commands: list[Envelope],
) -> None:
    n = len(commands)
    counts, delivered, tokens, processed = asyncio.run(
        _relay_crash_then_gateway(where, tmp_path, commands))
    assert counts == {"processed": n, "duplicate": n}
    copies: dict[uuid.UUID, set[tuple[str, bytes]]] = {}
    for envelope in delivered:
        copies.setdefault(envelope.message_id, set()).add((envelope.type, envelope.body))
    assert len(copies) == n  # one message ID per command ...
    assert all(len(versions) == 1 for versions in copies.values())  # ... copies identical (I2)
    assert sorted(v for (v,) in copies.values()) == sorted((c.type, c.body) for c in commands)
    assert (tokens, processed) == (n, n)  # one token per command for the counter to consume


def test_the_gateway_process_relays_its_inbox(where: Where, tmp_path: Path,
                                              commands: list[Envelope]) -> None:
    async def add() -> int:
        async with publisher(where) as rabbit, _system(where, tmp_path) as (_, system):
            await _reset(where, rabbit)
            return int(await system.inboxes["front"].add(commands))

    assert asyncio.run(add()) == len(commands)
    blob_dir = tmp_path / "blobs"
    blob_dir.mkdir(exist_ok=True)
    fleet = Fleet(where, blob_dir, tmp_path, delays=DELAYS)
    try:
        front = fleet.start("front", EO_INBOX_POLL_S="0.2", EO_INBOX_BATCH="7")

        async def relayed() -> None:
            async with publisher(where) as rabbit:
                async def all_there() -> bool:
                    return await rabbit.depth("counter") >= len(commands)

                await _until(all_there)

        asyncio.run(relayed())
        front.popen.send_signal(signal.SIGTERM)
        assert asyncio.run(fleet.exit_code(front, 30)) == 0, front.tail()
    finally:
        fleet.kill_all()
    assert len(front.events(INBOX_RELAYED)) == len(commands)
    assert len(front.events(TRANSACTION_COMMITTED)) == len(commands)

    async def after() -> tuple[int, int]:
        async with publisher(where) as rabbit:
            return (await _count(where, "SELECT count(*) FROM eo_inbox "
                                        "WHERE relayed_at IS NULL"),
                    await rabbit.depth("counter"))

    assert asyncio.run(after()) == (0, len(commands))
