"""A RabbitMQ delivery whose retry or dead-letter copy the broker does not confirm, on a
channel that stays open: the original goes back to the queue (`basic.reject` with requeue),
else it would stay unacked until the process ends. Found by `eo chaos --production` (seed
12, run 2): a retry queue electing its leader after a node's loss nacked the copy, and the
delivery waited 230 s, until the run's timeout."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from adapters.rabbitmq.delivery import RabbitDelivery
from adapters.rabbitmq.errors import PublishRefused
from application.envelope import Envelope
from application.errors import TransientError


class Channel:
    is_closed = False


class Message:
    """What `RabbitDelivery` asks of an incoming message."""

    def __init__(self) -> None:
        self.channel = Channel()
        self.rejected: list[bool] = []

    async def reject(self, requeue: bool = False) -> None:
        self.rejected.append(requeue)


class Connection:
    async def publish(self, queue: str, message: Any) -> None:
        raise PublishRefused(f"publish to {queue!r}: nacked by the broker")


class Source:
    """A source whose every copy the broker refuses."""

    connection = Connection()
    service_user = None
    stopped = False

    def __init__(self) -> None:
        self.acked: list[object] = []
        self.settled = 0

    def retry_queue(self, delay_s: float) -> str:
        return "orders.retry.100ms"

    async def ack(self, message: Any, message_id: object) -> None:
        self.acked.append(message_id)

    def settled_one(self) -> None:
        self.settled += 1

    async def requeue(self, message: Any) -> None:
        await message.reject(requeue=True)


async def test_a_refused_retry_copy_returns_the_delivery_to_the_queue() -> None:
    message, source = Message(), Source()
    delivery = RabbitDelivery(message, Envelope(uuid.uuid4(), "Add", b"{}"), 1,  # type: ignore[arg-type]
                              source)  # type: ignore[arg-type]
    with pytest.raises(TransientError, match="nacked"):
        await delivery.retry(0.1, "TransientError: the database restarted")
    assert message.rejected == [True]  # requeued: the broker delivers it again
    assert source.acked == []  # and never acked
    assert source.settled == 1  # its slot is free
    await delivery.retry(0.1, "again")  # settled: a second settle does nothing
    assert message.rejected == [True]


async def test_a_delivery_whose_channel_closed_is_left_to_the_broker() -> None:
    message, source = Message(), Source()
    message.channel.is_closed = True
    delivery = RabbitDelivery(message, Envelope(uuid.uuid4(), "Add", b"{}"), 1,  # type: ignore[arg-type]
                              source)  # type: ignore[arg-type]
    with pytest.raises(TransientError, match="channel is closed"):
        await delivery.retry(0.1, "whatever")
    assert message.rejected == []  # the broker requeued it when the channel closed


async def test_a_delivery_released_before_any_settlement_goes_back_to_its_queue() -> None:
    # its ack failed in this process (a failpoint): on a channel that stays open only a
    # reject brings it back before the channel closes
    message, source = Message(), Source()
    delivery = RabbitDelivery(message, Envelope(uuid.uuid4(), "Add", b"{}"), 1,  # type: ignore[arg-type]
                              source)  # type: ignore[arg-type]
    await delivery.release()
    assert message.rejected == [True]
    assert source.settled == 1  # its slot is free
    await delivery.release()  # once
    await delivery.ack()  # and no settlement after it: its tag is the broker's again
    assert (message.rejected, source.acked) == ([True], [])


async def test_a_delivery_released_after_its_ack_or_on_a_closed_channel_is_left_alone() -> None:
    # an ack that was tried may have reached the broker: a reject of its tag would close
    # the channel (406); a closed channel's deliveries are requeued by the broker
    acked, source = Message(), Source()
    delivery = RabbitDelivery(acked, Envelope(uuid.uuid4(), "Add", b"{}"), 1,  # type: ignore[arg-type]
                              source)  # type: ignore[arg-type]
    await delivery.ack()
    await delivery.release()
    closed = Message()
    closed.channel.is_closed = True
    lost = RabbitDelivery(closed, Envelope(uuid.uuid4(), "Add", b"{}"), 1,  # type: ignore[arg-type]
                          source)  # type: ignore[arg-type]
    await lost.release()
    assert (acked.rejected, closed.rejected) == ([], [])
    assert source.settled == 2
