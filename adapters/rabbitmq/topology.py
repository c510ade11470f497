"""An endpoint's queues: quorum work queue, TTL retry queues, dead-letter queue."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aio_pika import ExchangeType
from aio_pika.abc import AbstractChannel

from adapters.rabbitmq.errors import translated
from adapters.rabbitmq.urls import connect_first


@dataclass(frozen=True)
class QueueNames:
    """The queues of one endpoint. Messages go through the default exchange with the queue
    name as routing key; a gateway's work queue is also bound to `inbound`, the fanout
    exchange outside producers may be given the right to publish to (and nothing else)."""

    work: str
    retries: tuple[str, ...]
    dead_letter: str

    @property
    def all_but_dead_letters(self) -> tuple[str, ...]:
        """The work queue and the retry queues."""
        return (self.work, *self.retries)

    @property
    def inbound(self) -> str:
        """`<endpoint>.in`: a gateway's exchange for outside producers."""
        return f"{self.work}.in"


class Declaring(Protocol):
    """Where queues are declared: a channel, and a way to ask whether a queue exists without
    closing it (`adapters.rabbitmq.connection.RabbitConnection` is one)."""

    @property
    def channel(self) -> AbstractChannel:
        """The channel to declare on."""

    async def queue_exists(self, queue: str) -> bool:
        """Whether `queue` exists."""


def queue_names(endpoint: str, retry_delays_s: Sequence[float] = ()) -> QueueNames:
    """`<endpoint>`, `<endpoint>.retry.<ms>ms` for each retry delay (its milliseconds: the
    queue's `x-message-ttl`), `<endpoint>.dlq`."""
    return QueueNames(endpoint, tuple(f"{endpoint}.retry.{delay_ms(d)}ms"
                                      for d in retry_delays_s), f"{endpoint}.dlq")


def legacy_retry_names(endpoint: str, n_delays: int) -> tuple[str, ...]:
    """`<endpoint>.retry.<i>` for i in 0..n_delays-1: the classic retry queues of releases
    before the quorum ones. Nothing publishes to them any more; what they hold still
    expires into the work queue, and an operator deletes them once empty
    (docs/operations.md). Cleaning up and counting what is at rest include them."""
    return tuple(f"{endpoint}.retry.{i}" for i in range(n_delays))


def delay_ms(delay_s: float) -> int:
    """A retry delay in whole milliseconds, the unit of `x-message-ttl`."""
    return round(delay_s * 1000)


def retry_index(retry_delays_s: Sequence[float], delay_s: float) -> int:
    """Index of the retry queue to use for `delay_s`: the one with the smallest delay that is
    at least `delay_s`, else the longest. Compared in milliseconds, as the broker applies
    them. Raises ValueError when there is no retry queue."""
    if not retry_delays_s:
        raise ValueError("no retry delays configured")
    wanted = delay_ms(delay_s)
    fitting = [(delay_ms(d), i) for i, d in enumerate(retry_delays_s) if delay_ms(d) >= wanted]
    if fitting:
        return min(fitting)[1]
    return max((delay_ms(d), i) for i, d in enumerate(retry_delays_s))[1]


async def declare(rabbit: Declaring, endpoint: str, retry_delays_s: Sequence[float],
                  delivery_limit: int, dead_letter_max_bytes: int | None = None,
                  inbound: bool = False) -> QueueNames:
    """Declare `endpoint`'s queues idempotently (on `rabbit`'s channel) and return their
    names.

    - work queue `<endpoint>`: durable quorum queue; after `delivery_limit` redeliveries (a
      message whose processing keeps killing consumers) the broker dead-letters it to the
      dead-letter queue instead of redelivering it forever;
    - `<endpoint>.retry.<ms>ms`: durable quorum queues holding a message for one of
      `retry_delays_s` (`x-message-ttl`, milliseconds), then dead-lettering it back to the
      work queue at least once (`x-dead-letter-strategy`, which needs `x-overflow:
      reject-publish`): delayed redelivery without a plugin that survives the loss of a
      cluster node (a classic queue's messages wait for its one node to come back, and
      publishing to it is refused meanwhile; quorum queues' TTL needs RabbitMQ 3.10);
    - `<endpoint>.dlq`: durable quorum queue; when it does not exist yet and
      `dead_letter_max_bytes` is set, bounded to that many bytes of bodies
      (`x-max-length-bytes`) and refusing more (`x-overflow: reject-publish`: nothing is
      dropped, the consumer parks a refused dead letter in a retry queue). An existing one is
      kept as it is: queue arguments cannot change, so a dead-letter queue declared before
      is bounded by a broker policy instead (docs/operations.md);
    - with `inbound` (a gateway): the durable fanout exchange `<endpoint>.in`, bound to the
      work queue, so a broker can let outside producers publish there and nowhere else (the
      default exchange routes to every queue).

    Raises ValueError on a negative delay or a `delivery_limit` < 1, `TransientError` when the
    broker fails or a queue already exists with other arguments (the channel is closed then).
    """
    if delivery_limit < 1:
        raise ValueError(f"delivery_limit must be >= 1, got {delivery_limit}")
    if any(d < 0 for d in retry_delays_s):
        raise ValueError(f"retry delays must be >= 0 s, got {list(retry_delays_s)}")
    names = queue_names(endpoint, retry_delays_s)
    channel = rabbit.channel
    with translated(f"declaring the queues of {endpoint!r}"):
        if await rabbit.queue_exists(names.dead_letter):
            await channel.declare_queue(names.dead_letter, passive=True)
        else:
            await channel.declare_queue(names.dead_letter, durable=True,
                                        arguments=dead_letter_arguments(dead_letter_max_bytes))
        work = await channel.declare_queue(names.work, durable=True, arguments={
            "x-queue-type": "quorum",
            "x-delivery-limit": delivery_limit,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": names.dead_letter,
        })
        if inbound:
            exchange = await channel.declare_exchange(names.inbound, ExchangeType.FANOUT,
                                                      durable=True)
            await work.bind(exchange)
        for name, delay_s in zip(names.retries, retry_delays_s, strict=True):
            await channel.declare_queue(name, durable=True, arguments={
                "x-queue-type": "quorum",
                "x-message-ttl": delay_ms(delay_s),
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": names.work,
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            })
    return names


def dead_letter_arguments(max_bytes: int | None) -> dict[str, Any]:
    """The arguments of a new dead-letter queue: a quorum queue, bounded to `max_bytes` of
    message bodies with `reject-publish` when `max_bytes` is set (and not 0)."""
    arguments: dict[str, Any] = {"x-queue-type": "quorum"}
    if max_bytes:
        arguments.update({"x-max-length-bytes": max_bytes, "x-overflow": "reject-publish"})
    return arguments


async def delete_queues(amqp_url: str | Sequence[str], endpoints: Sequence[str],
                        retry_delays_s: Sequence[float]) -> None:
    """Delete every queue of `endpoints` (work, retry queues of `retry_delays_s` and the
    legacy ones, dead-letter queue) and a gateway's inbound exchange on the broker at
    `amqp_url`, messages included: a demo,
    campaign or test run starts from nothing. A queue or exchange that does not exist is no
    error. Raises aio_pika's connection errors."""

    connection = await connect_first(amqp_url)
    try:
        for endpoint in endpoints:
            names = queue_names(endpoint, retry_delays_s)
            for name in (names.work, *names.retries,
                         *legacy_retry_names(endpoint, len(retry_delays_s)), names.dead_letter):
                channel = await connection.channel()
                await channel.queue_delete(name)
                await channel.close()
            channel = await connection.channel()
            await channel.exchange_delete(names.inbound)
            await channel.close()
    finally:
        await connection.close()


@dataclass(frozen=True)
class QueueDepths:
    """Messages waiting in an endpoint's queues: its work queue, its retry queues together,
    its dead-letter queue."""

    work: int
    retries: int
    dead_letter: int


async def _depth(connection: Any, name: str) -> int | None:
    """Messages in queue `name` (None: no such queue), by a passive declare on a channel of
    its own (a refused one closes its channel)."""
    import aio_pika

    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(name, passive=True)
        return queue.declaration_result.message_count or 0
    except aio_pika.exceptions.ChannelClosed:
        return None
    finally:
        if not channel.is_closed:
            await channel.close()


async def queue_depths(amqp_url: str | Sequence[str], endpoints: Sequence[str],
                       retry_delays_s: Sequence[float]) -> dict[str, QueueDepths | None]:
    """Each endpoint's `QueueDepths` (None: its queues are not declared yet), read with
    passive declares on the broker at `amqp_url`. Raises aio_pika's connection errors."""

    depths: dict[str, QueueDepths | None] = {}
    connection = await connect_first(amqp_url)
    try:
        for endpoint in endpoints:
            names = queue_names(endpoint, retry_delays_s)
            work, dead = await _depth(connection, names.work), await _depth(
                connection, names.dead_letter)
            retries = [await _depth(connection, q) for q in names.retries]
            legacy = [await _depth(connection, q)
                      for q in legacy_retry_names(endpoint, len(retry_delays_s))]
            if work is None or dead is None or None in retries:
                depths[endpoint] = None
                continue
            depths[endpoint] = QueueDepths(work, sum(r or 0 for r in retries + legacy), dead)
    finally:
        await connection.close()
    return depths


async def dead_letter_depths(amqp_url: str | Sequence[str], endpoints: Sequence[str]
                             ) -> dict[str, int | None]:
    """Messages in each endpoint's dead-letter queue (None: the queue does not exist), read
    with passive declares on the broker at `amqp_url`. Raises aio_pika's connection errors."""

    connection = await connect_first(amqp_url)
    try:
        return {endpoint: await _depth(connection, queue_names(endpoint).dead_letter)
                for endpoint in endpoints}
    finally:
        await connection.close()
