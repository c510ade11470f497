"""A connection given a cluster's node addresses (`EO_AMQP_ADDRESSES`): the first connection
goes to the first node that answers, a lost one reconnects from the node after it. A node
that does not answer is a free port of 127.0.0.1 where nothing listens; the broker-side close
closes this test's own named connection only."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import uuid
from collections.abc import Iterator

import aio_pika
import pytest

from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.urls import broker_urls, redacted
from tests.support.services import discover
from tools.scratch import controllable, rabbitmqctl


@pytest.fixture(scope="module")
def amqp_url() -> Iterator[str]:
    services = discover(postgres=False)
    yield services.amqp_url
    services.close()


def silent_node(url: str) -> str:
    """`url` at a port of 127.0.0.1 where nothing listens (a node that is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return broker_urls(url, [f"127.0.0.1:{port}"])[1]


async def confirmed_publish(connection: RabbitConnection) -> None:
    """A publish the broker confirms (a queue of the test's own, deleted after)."""
    queue = f"it-addresses-{uuid.uuid4().hex[:12]}"
    await connection.channel.declare_queue(queue, auto_delete=False)
    try:
        await connection.publish(queue, aio_pika.Message(b"x", message_id=str(uuid.uuid4())))
    finally:
        await connection.channel.queue_delete(queue)


async def test_the_first_connection_goes_to_the_first_node_that_answers(
        amqp_url: str, caplog: pytest.LogCaptureFixture) -> None:
    down = silent_node(amqp_url)
    connection = RabbitConnection([down, amqp_url], reconnect_delays_s=(0.1,))
    with caplog.at_level(logging.WARNING, "adapters.rabbitmq.connection"):
        await connection.start()
    try:
        assert connection.url == amqp_url
        assert f"cannot connect to {redacted(down)}" in caplog.text
        await confirmed_publish(connection)
    finally:
        await connection.close()


async def test_no_node_answering_fails_the_start_naming_them(amqp_url: str) -> None:
    first, second = silent_node(amqp_url), silent_node(amqp_url)
    connection = RabbitConnection([first, second])
    with pytest.raises(Exception, match="connecting to") as raised:
        await connection.start()
    assert redacted(first) in str(raised.value)
    assert redacted(second) in str(raised.value)


def close_named(name: str) -> None:
    """The broker closes the connection named `name` (CONNECTION_FORCED)."""
    rows = rabbitmqctl("list_connections", "pid", "client_properties").splitlines()
    pids = [row.split("\t", 1)[0] for row in rows
            if f'{{"connection_name",{json.dumps(name)}}}' in row]
    assert len(pids) == 1, f"connection {name!r}: {len(pids)} found"
    rabbitmqctl("close_connection", pids[0], "test: the node went away")


async def test_a_lost_connection_reconnects_from_the_node_after_the_one_lost(
        amqp_url: str, caplog: pytest.LogCaptureFixture) -> None:
    if not controllable(amqp_url):
        pytest.skip("closing a connection broker-side needs rabbitmqctl on the broker's host")
    down = silent_node(amqp_url)
    name = f"eo test addresses {uuid.uuid4().hex[:8]}"
    connection = RabbitConnection([amqp_url, down], reconnect_delays_s=(0.1,), name=name)
    await connection.start()
    try:
        assert connection.url == amqp_url  # the first node answered: the silent one untried
        with caplog.at_level(logging.WARNING, "adapters.rabbitmq.connection"):
            await asyncio.to_thread(close_named, name)
            for _ in range(100):
                if connection.reconnections:
                    break
                await asyncio.sleep(0.1)
        assert connection.reconnections == 1
        # the node after the lost one was tried first, then the first again
        assert f"cannot connect to {redacted(down)}" in caplog.text
        assert connection.url == amqp_url
        await confirmed_publish(connection)
    finally:
        await connection.close()

