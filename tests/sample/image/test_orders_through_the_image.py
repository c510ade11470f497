"""The sample's orders through the image (issue 26): every endpoint in a container of the image
`deploy/image/check` built (`EO_TEST_IMAGE`; skipped without it), on PostgreSQL, RabbitMQ and
an S3 API of the host: three TPC-H orders from an outside producer to the gateway, through
orders (an invoice blob, the payments callee over HTTP) to the ledger. Asserted: the oracle
holds (each order confirmed or rejected once, payments and ledger agree, one invoice per
order), nothing is left at rest (tokens, unfinished transactions), and every container stops
with status 0 on SIGTERM."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from adapters.postgres.pool import create_pool
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dispatcher import RabbitDispatcher
from adapters.s3.blob_store import S3BlobStore, s3_client_resource
from adapters.system.clock import SystemClock
from application.codec import encode
from application.envelope import Envelope
from domain.sample.payments import open_account
from entrypoints.local import postgres_stores
from service.registry import REGISTRY
from tests.sample.chaos.cluster import CREDIT_LIMIT, pick_orders
from tests.support.image import ImageFleet, image_fleet, needs_image, s3_api
from tests.support.processes import Where, calling, unfinished, until, where_for
from tools.tpch.oracle import check_oracle

pytestmark = [needs_image, pytest.mark.slow]  # containers

ORDERS = pick_orders(3, seed=7)
BUCKET = "eo-invoices"
TOKEN = "image-orders-payments-token"


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with where_for("eo_image_orders", "eo-image-orders") as found:
        yield found


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    with s3_api() as url:
        yield url


@pytest.fixture
async def fleet(where: Where, tmp_path: Path) -> AsyncIterator[ImageFleet]:
    async with image_fleet(where, tmp_path) as started:
        yield started


@pytest.fixture
async def pool(where: Where) -> AsyncIterator[asyncpg.Pool]:
    created = await create_pool(where.dsn, max_size=2)
    try:
        yield created
    finally:
        await created.close()


async def test_three_orders_go_through_the_image_s_containers_exactly_once(
        fleet: ImageFleet, where: Where, s3: str, pool: asyncpg.Pool) -> None:
    stores = postgres_stores(pool, SystemClock(), REGISTRY)
    await stores["payments"].seed_states({
        str(c): open_account(c, b, CREDIT_LIMIT) for c, b in ORDERS.customers})
    settings: dict[str, str | None] = {
        "EO_BLOB_STORE": "s3", "EO_S3_ENDPOINT_URL": s3, "EO_S3_BUCKET": BUCKET,
        "EO_S3_ACCESS_KEY": "local", "EO_S3_SECRET_KEY": "local"}
    payments = fleet.serve("payments", TOKEN, **settings)
    await fleet.ready(payments, timeout_s=90)
    assert payments.url is not None
    procs = [payments] + [
        fleet.start(name, **settings, **calling("payments", payments.url, TOKEN))
        for name in ("gateway", "orders", "ledger")]
    await fleet.ready(*procs, timeout_s=90)

    rabbit = RabbitConnection(where.amqp_url)
    await rabbit.start()
    try:  # an outside producer: the commands' natural IDs, no token
        dispatcher = RabbitDispatcher(rabbit)
        for command in ORDERS.commands:
            await dispatcher.dispatch("gateway", Envelope(
                command.message_id, type(command.message).__name__,
                encode(command.message)))
    finally:
        await rabbit.close()

    async def blob_keys() -> list[str]:
        async with s3_client_resource(s3, "us-east-1", "local", "local") as client:
            return await S3BlobStore(client, BUCKET).keys()

    async def settled() -> bool:
        oracle = check_oracle(ORDERS, await stores["orders"].states(),
                              await stores["ledger"].states(),
                              await stores["payments"].states(), await blob_keys(),
                              CREDIT_LIMIT)
        return (not oracle.violations and await unfinished(pool) == 0
                and await pool.fetchval("SELECT count(*) FROM eo_token") == 0)

    await until(settled, 120, "three orders through the containers", fleet)
    oracle = check_oracle(ORDERS, await stores["orders"].states(),
                          await stores["ledger"].states(), await stores["payments"].states(),
                          await blob_keys(), CREDIT_LIMIT)
    assert oracle.confirmed + oracle.rejected == len(ORDERS.expected) == 3

    for proc in procs:
        proc.popen.send_signal(signal.SIGTERM)
    for proc in procs:
        code = await fleet.exit_code(proc, 60)
        assert code == 0, f"{proc.name} exited with {code} on SIGTERM\n{proc.tail()}"
