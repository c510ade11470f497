"""Which errors the RabbitMQ adapters retry as "the broker is away" (adapters/rabbitmq/
errors.py): the driver's, not a programming error. A `RuntimeError` raised inside the retried
operation propagates at once; the one `RuntimeError` aiormq raises for a connection that
closed while a channel opened stays transient, by where it is raised."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from adapters.rabbitmq.backoff import reconnecting
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.errors import DRIVER_ERRORS, translated
from application.errors import TransientError


class Buggy:
    """A step that raises `RuntimeError("a bug")` on every call, counting them."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        raise RuntimeError("a bug")


async def test_a_runtime_error_in_the_retried_step_propagates_at_once() -> None:
    step = Buggy()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(RuntimeError, match="a bug"):
        await reconnecting(step, started + 1.0, delays_s=(0.01,), transient=DRIVER_ERRORS)
    assert step.calls == 1  # not tried again until the deadline
    assert loop.time() - started < 0.5


def test_a_runtime_error_is_not_translated_into_a_transient_error() -> None:
    with pytest.raises(RuntimeError, match="a bug"), translated("publishing"):
        raise RuntimeError("a bug")
    with pytest.raises(TransientError, match="publishing: ConnectionResetError"), \
            translated("publishing"):
        raise ConnectionResetError("reset by peer")


def test_aiormqs_bare_exception_of_a_closed_connection_is_transient() -> None:
    """aiormq rejects a pending RPC with a bare `Exception` when its connection closes
    without a reason: a consumer's watchdog opening a channel as a paused node's connection
    closed crashed its process with it (exit 1, seen in `eo chaos --production`)."""
    with pytest.raises(TransientError, match="opening a channel: the connection closed"), \
            translated("opening a channel"):
        raise Exception  # what aiormq raises
    with pytest.raises(ValueError, match="a bug"), translated("opening a channel"):
        raise ValueError("a bug")  # any other error is not a lost connection


class BuggyReopen(RabbitConnection):
    """A connection whose recovery hits a programming error each time it reopens."""

    def __init__(self) -> None:
        super().__init__("amqp://guest:secret@127.0.0.1:1/", give_up_after_s=1.0,
                         reconnect_delays_s=(0.01,))
        self.reopens = 0

    async def _reopen(self) -> None:
        self.reopens += 1
        raise RuntimeError("a bug in the reopening")


async def test_a_programming_error_while_recovering_fails_the_connection_at_once() -> None:
    """The supervisor does not retry a bug for `give_up_after_s`: it sets `failed` at the
    first one, with the error (and no password) in `failure`, so the process exits."""
    connection = BuggyReopen()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await connection._recover()
    assert connection.reopens == 1
    assert loop.time() - started < 0.5
    assert connection.failed.is_set()
    assert connection.failure is not None
    assert "RuntimeError: a bug in the reopening" in connection.failure
    assert "secret" not in connection.failure


class Closing:
    """An aio-pika connection whose transport closes while a channel opens on it: the channel
    open raises aiormq's `RuntimeError("<Connection ...> closed")`."""

    def __init__(self, closes: bool) -> None:
        self.closes = closes
        self.is_closed = False
        self.transport = SimpleNamespace(connection=SimpleNamespace(is_closed=False))

    async def channel(self, **options: Any) -> Any:
        if self.closes:
            self.transport.connection.is_closed = True
            raise RuntimeError("<Connection: 'amqp://127.0.0.1:5672/'> closed")
        raise RuntimeError("a bug in the channel's options")


class Opening(RabbitConnection):
    def __init__(self, connection: Closing) -> None:
        super().__init__("amqp://guest:guest@127.0.0.1:1/")
        self._connection = connection  # type: ignore[assignment]
        self._up.set()


async def test_a_connection_that_closes_while_a_channel_opens_is_transient() -> None:
    with pytest.raises(TransientError, match="ClosedWhileOpening"):
        await Opening(Closing(closes=True)).open_channel()


async def test_a_runtime_error_opening_a_channel_on_a_live_connection_propagates() -> None:
    with pytest.raises(RuntimeError, match="a bug in the channel's options"):
        await Opening(Closing(closes=False)).open_channel()


async def test_a_requeue_on_a_connection_that_closes_without_a_reason_is_left_to_the_broker(
        ) -> None:
    # a delivery given back (`Delivery.release`) as its connection closes: aiormq fails the
    # reject with a bare Exception; the broker requeues the delivery itself, no error here.
    # Any other error of the reject is a bug and propagates.
    from adapters.rabbitmq.consumer import RabbitSource

    source = RabbitSource(RabbitConnection(["amqp://guest:guest@127.0.0.1:1/"]), "orders",
                          (0.1,))

    class Message:
        delivery_tag = 7
        channel = SimpleNamespace(is_closed=True)

        def __init__(self, error: Exception) -> None:
            self.error = error

        async def reject(self, requeue: bool = False) -> None:
            raise self.error

    await source.requeue(Message(Exception()))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="a bug"):
        await source.requeue(Message(RuntimeError("a bug")))  # type: ignore[arg-type]


async def test_a_publish_failed_by_aiormqs_bare_exception_is_transient() -> None:
    """A retry's copy published as its channel closed without a reason: aiormq fails the
    publish with a bare `Exception`, which escaped the settlement's handling (`Task exception
    was never retrieved`, no `message.settlement_failed`: eo chaos --production seed 48's
    fixture campaign, run 5, reported the run as an unexplained re-run)."""
    from adapters.rabbitmq.publishing import ConfirmedPublisher

    class Closing:
        async def publish(self, *_args: Any, **_kwargs: Any) -> None:
            raise Exception  # what aiormq raises

    up = asyncio.Event()
    up.set()
    publisher = ConfirmedPublisher(lambda: SimpleNamespace(default_exchange=Closing()),  # type: ignore[arg-type, return-value]
                                   up, 1.0)
    message = SimpleNamespace(message_id="m-1")
    with pytest.raises(TransientError, match=r"publish to 'orders\.retry\.100ms': the "
                                             r"connection closed"):
        await publisher.publish("orders.retry.100ms", message)  # type: ignore[arg-type]
    assert publisher.waiting == {}  # its turn ended
