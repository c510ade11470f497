"""The broker as the chaos campaign sees it: messages published as an outside producer does,
connections closed from the broker's side and each work queue's consumer count over time (a
virtual host of the campaign's own: tools/scratch.py)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import aio_pika

from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.urls import connect_first
from application.errors import TransientError
from tools.chaos.workload import OutsideMessage
from tools.scratch import rabbitmqctl, vhost_of


async def publish_messages(amqp_url: str | Sequence[str], messages: Sequence[OutsideMessage],
                           rate: float, rng: random.Random) -> int:
    """Publish `messages` as an outside producer does (the URL's user as `user_id`,
    publisher confirms, persistent); a share `rate` twice: half at once (concurrent copies),
    half at the end (a late re-send). Returns the copies."""
    first = amqp_url if isinstance(amqp_url, str) else amqp_url[0]
    user = unquote(urlsplit(first).username or "") or "guest"
    connection = await connect_first(amqp_url)
    late: list[OutsideMessage] = []
    copies = 0
    try:
        channel = await connection.channel(publisher_confirms=True)

        async def publish(message: OutsideMessage) -> None:
            await channel.default_exchange.publish(
                aio_pika.Message(message.body, message_id=message.message_id,
                                 type=message.type, user_id=user, headers=dict(message.headers),
                                 content_type="application/json",
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=message.queue)

        for start in range(0, len(messages), 200):
            batch: list[OutsideMessage] = []
            for message in messages[start:start + 200]:
                batch.append(message)
                draw = rng.random()
                if draw < rate / 2:
                    batch.append(message)
                    copies += 1
                elif draw < rate:
                    late.append(message)
            await asyncio.gather(*(publish(m) for m in batch))
        await asyncio.gather(*(publish(m) for m in late))
    finally:
        await connection.close()
    return copies + len(late)


def close_all_connections(url: str, reason: str = "chaos: broker-side close") -> None:
    """The broker closes every connection of `url`'s virtual host (CONNECTION_FORCED), as a
    broker restart or a network blip would. Raises like `rabbitmqctl`."""
    rabbitmqctl("close_all_connections", "--vhost", vhost_of(url), "--limit", "1000", reason)


@dataclass
class ConsumerGaps:
    """How long each work queue went without a consumer, sampled by `observe`. A stretch
    during which one of the queue's processes was down or still starting (killed, crashed,
    restarting) is an expected gap and goes to `while_restarting_s`; any other, while every
    process was up (a broker-side close, a lost or stalled consumer), to `longest_s`. Before
    a queue first had a consumer nothing is counted (the processes' first start)."""

    longest_s: dict[str, float] = field(default_factory=dict)
    while_restarting_s: dict[str, float] = field(default_factory=dict)
    _since: dict[str, float] = field(default_factory=dict)
    _excused: set[str] = field(default_factory=set)
    _seen: set[str] = field(default_factory=set)

    async def observe(self, rabbit: RabbitConnection, queues: Iterable[str],
                      restarting: Collection[str] = ()) -> None:
        """Sample the consumer count of each queue once; `restarting`: the queues one of
        whose processes is down or starting now. A queue the connection cannot inspect now
        is skipped (the next sample decides)."""
        now = time.monotonic()
        for queue in queues:
            try:
                _, consumers = await rabbit.queue_counts(queue)
            except TransientError:
                continue
            if consumers:
                self._seen.add(queue)
                self._end(queue, now)
            elif queue in self._seen:
                self._since.setdefault(queue, now)
                if queue in restarting:
                    self._excused.add(queue)

    def finish(self) -> None:
        """Close the stretches still running (at the end of a run)."""
        now = time.monotonic()
        for queue in list(self._since):
            self._end(queue, now)

    def _end(self, queue: str, now: float) -> None:
        since = self._since.pop(queue, None)
        if since is None:
            return
        target = self.while_restarting_s if queue in self._excused else self.longest_s
        self._excused.discard(queue)
        target[queue] = max(target.get(queue, 0.0), now - since)
