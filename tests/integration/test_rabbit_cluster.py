"""The RabbitMQ adapters on a cluster of three nodes of their own (tools/faults/
rabbit_cluster.py; never the machine's broker) losing a node: the work queue's leader killed
with deliveries unacked and the consumer connected to it, and a retry waiting on a killed
node. Skipped where nodes cannot be started (no root, no Debian rabbitmq-server)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.consumer import RabbitSource
from adapters.rabbitmq.delivery import RabbitDelivery
from adapters.rabbitmq.dispatcher import RabbitDispatcher
from adapters.rabbitmq.topology import QueueNames, declare
from application.envelope import Envelope
from application.errors import TransientError
from tools.faults.rabbit_cluster import RabbitCluster, RabbitNode, available

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))

DELAYS = (0.05, 3.0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RabbitCluster]:
    made = RabbitCluster()  # under /tmp: pytest's own directories are root's alone
    asyncio.run(made.start())
    try:
        yield made
    finally:
        asyncio.run(made.remove())


def connection(urls: list[str]) -> RabbitConnection:
    return RabbitConnection(urls, reconnect_delays_s=(0.1, 0.5), give_up_after_s=60)


def others(cluster: RabbitCluster, node: RabbitNode) -> list[str]:
    return [n.url for n in cluster.nodes if n is not node]


@pytest.fixture
async def endpoint(cluster: RabbitCluster) -> AsyncIterator[QueueNames]:
    """A fresh endpoint's queues, declared through every node; deleted after, once every
    node runs again."""
    admin = connection(cluster.urls)
    await admin.start()
    names = await declare(admin, f"it-{uuid.uuid4().hex[:10]}", DELAYS, delivery_limit=5)
    try:
        yield names
    finally:
        for node in cluster.nodes:
            if not node.running:
                await cluster.restart(node)
        for name in (names.work, *names.retries, names.dead_letter):
            await admin.channel.queue_delete(name)
        await admin.close()


def message(n: int) -> Envelope:
    return Envelope(uuid.uuid4(), "Add", f'{{"n": {n}}}'.encode())


async def test_the_leaders_node_killed_with_deliveries_unacked_loses_none(
        cluster: RabbitCluster, endpoint: QueueNames) -> None:
    leader = cluster.node(await cluster.leader_of(endpoint.work))
    # the consumer on the leader's node (its connection dies with it), the publisher elsewhere
    consumer = connection([leader.url, *others(cluster, leader)])
    publisher = connection(others(cluster, leader))
    await consumer.start()
    await publisher.start()
    sent = [message(n) for n in range(20)]
    for envelope in sent:
        await RabbitDispatcher(publisher).dispatch(endpoint.work, envelope)
    source = RabbitSource(consumer, endpoint.work, DELAYS, watchdog_s=5)
    deliveries = source.deliveries(prefetch=8)
    acked: set[uuid.UUID] = set()
    held: list[RabbitDelivery] = []
    try:
        while len(held) < 5:  # some acked, five held unacked when the node dies
            delivery = await asyncio.wait_for(anext(deliveries), 10)
            if len(acked) < 3:
                await delivery.ack()
                acked.add(delivery.envelope.message_id)
            else:
                held.append(delivery)
        await cluster.kill(leader)
        for delivery in held:  # into a dead connection: fails, or vanishes with the node
            with contextlib.suppress(TransientError):
                await delivery.ack()
        again: set[uuid.UUID] = set()
        while acked != {e.message_id for e in sent}:
            delivery = await asyncio.wait_for(anext(deliveries), 60)
            await delivery.ack()
            acked.add(delivery.envelope.message_id)
            again.add(delivery.envelope.message_id)
        # the held ones came again from the new leader: no ack reached the dead node
        assert {d.envelope.message_id for d in held} <= again
        assert consumer.url != leader.url  # it moved to a surviving node
        assert consumer.reconnections >= 1
        ready, _consumers = await publisher.queue_counts(endpoint.work)
        assert ready == 0  # (the broker lists the dead node's consumer until it is back)
    finally:
        await source.stop()
        await consumer.close()
        await publisher.close()


async def test_a_retry_waiting_on_a_killed_leader_reaches_the_work_queue(
        cluster: RabbitCluster, endpoint: QueueNames) -> None:
    retry = endpoint.retries[1]  # 3 s
    leader = cluster.node(await cluster.leader_of(retry))
    publisher = connection(others(cluster, leader))
    await publisher.start()
    try:
        envelope = message(1)
        await RabbitDispatcher(publisher).dispatch(retry, envelope)
        await cluster.kill(leader)  # the retry's TTL runs out on the new leader
        for _ in range(200):
            ready, _consumers = await publisher.queue_counts(endpoint.work)
            if ready:
                break
            await asyncio.sleep(0.1)
        assert await publisher.queue_counts(endpoint.work) == (1, 0)
        assert await publisher.queue_counts(retry) == (0, 0)
    finally:
        await publisher.close()
