"""An in-process broker with at-least-once semantics: redelivery, delayed retry, dead letters."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter, defaultdict, deque
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from application.envelope import (
    ATTEMPTS_HEADER,
    RETRY_REASON_HEADER,
    Envelope,
    capped,
    clipped_body,
    dead_letter_headers,
)
from application.errors import TransientError
from application.ports import Clock, DeadLetterPublisher, Delivery, MessageDispatcher


@dataclass
class _Queue:
    ready: deque[tuple[Envelope, int]] = field(default_factory=deque)
    signal: asyncio.Condition = field(default_factory=asyncio.Condition)


class MemoryDelivery(Delivery):
    """A delivery held by one consumer until settled; an unsettled one returns to the queue
    when its consumer is dropped (a lost connection or a crash)."""

    def __init__(self, broker: MemoryBroker, queue: str, envelope: Envelope, attempt: int,
                 consumer: str, tag: int) -> None:
        self.envelope = envelope
        self.attempt = attempt
        self._broker, self._queue, self.consumer, self.tag = broker, queue, consumer, tag

    async def ack(self) -> None:
        self._broker._settle(self)

    async def retry(self, delay_s: float, reason: str) -> None:
        if self._broker._settle(self):
            headers = {**self.envelope.headers, ATTEMPTS_HEADER: str(self.attempt),
                       RETRY_REASON_HEADER: capped(reason)}
            copy = replace(self.envelope, headers=MappingProxyType(headers))
            self._broker._later(self._queue, copy, self.attempt + 1, delay_s)

    async def dead_letter(self, reason: str, endpoint: str, body_limit: int | None = None
                          ) -> None:
        broker = self._broker
        now = broker.clock.now() if broker.clock is not None else datetime.now(UTC)
        headers = {**self.envelope.headers,
                   **dead_letter_headers(reason, endpoint, self.attempt, now)}
        body = self.envelope.body
        if body_limit is not None:
            body, sizes = clipped_body(body, body_limit)
            headers.update(sizes)
        copy = replace(self.envelope, body=body, headers=MappingProxyType(headers))
        await broker.wait_for_room(self._queue, copy)
        if broker._settle(self):
            broker.dead_letters[self._queue].append(copy)


    async def release(self) -> None:
        """Back to the front of its queue, unless it was settled or its consumer dropped."""
        self._broker._give_back(self)


class MemoryBroker(MessageDispatcher, DeadLetterPublisher):
    """Queues named by endpoint. `dispatch` is confirmed at once; `consume` hands deliveries
    to a named consumer; `drop_consumer` puts that consumer's unsettled deliveries back
    (redelivery, possibly to another consumer while the first still runs: concurrent
    copies). `publish` re-publishes a copy (duplicate injection). With `shuffle`, each
    delivery is taken from a random place in the queue (out-of-order delivery). With
    `dead_letter_max_bytes`, a dead-letter queue refuses a copy whose body would take it past
    that many bytes (RabbitMQ's `x-max-length-bytes` with `reject-publish`): the dead letter
    waits for room, and its queue delivers nothing new meanwhile (`wait_for_room`)."""

    def __init__(self, shuffle: random.Random | None = None,
                 dead_letter_max_bytes: int | None = None,
                 dead_letter_wait_s: float = 0.01, clock: Clock | None = None) -> None:
        """`clock`: what stamps dead letters (`eo-dead-lettered-at`); the wall clock when
        None."""
        self._shuffle = shuffle
        self.clock = clock
        self.dead_letter_max_bytes = dead_letter_max_bytes or None  # 0: unbounded
        self.dead_letter_wait_s = dead_letter_wait_s
        self._waiting: dict[str, int] = defaultdict(int)
        self._queues: dict[str, _Queue] = defaultdict(_Queue)
        self._in_flight: dict[int, MemoryDelivery] = {}
        self._tags = itertools.count(1)
        self._delayed = 0
        self.dead_letters: dict[str, list[Envelope]] = defaultdict(list)
        self.published = 0
        self._background: set[asyncio.Task[None]] = set()
        self._cancelled: set[str] = set()  # consumers whose `consume` ends

    async def dispatch(self, destination: str, envelope: Envelope) -> None:
        await asyncio.sleep(0)
        await self._put(destination, envelope, 1)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` as a task this broker holds until it ends (the event loop holds tasks
        only weakly)."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def publish(self, destination: str, envelope: Envelope, attempt: int = 1) -> None:
        """Enqueue without waiting (injection from outside a consumer)."""
        self._queues[destination].ready.append((envelope, attempt))
        self.published += 1
        self._spawn(self._notify(destination))

    async def _put(self, destination: str, envelope: Envelope, attempt: int) -> None:
        queue = self._queues[destination]
        queue.ready.append((envelope, attempt))
        self.published += 1
        async with queue.signal:
            queue.signal.notify()

    async def _notify(self, destination: str) -> None:
        queue = self._queues[destination]
        async with queue.signal:
            queue.signal.notify_all()

    def dead_letter_fits(self, queue: str, envelope: Envelope) -> bool:
        """Whether the dead-letter queue of `queue` takes `envelope` within its byte bound."""
        if self.dead_letter_max_bytes is None:
            return True
        held = sum(len(e.body) for e in self.dead_letters[queue])
        return held + len(envelope.body) <= self.dead_letter_max_bytes

    async def dead_letter(self, endpoint: str, envelope: Envelope) -> None:
        """`DeadLetterPublisher`: add `envelope` to `endpoint`'s dead letters; raises
        `TransientError` when it does not fit (full)."""
        await asyncio.sleep(0)
        if not self.dead_letter_fits(endpoint, envelope):
            raise TransientError(f"the dead-letter queue of {endpoint} is full")
        self.dead_letters[endpoint].append(envelope)

    def blocked(self, queue: str) -> bool:
        """Whether a dead letter of `queue` waits for room (`queue` delivers nothing new)."""
        return self._waiting[queue] > 0

    async def wait_for_room(self, queue: str, envelope: Envelope) -> None:
        """Return once the dead-letter queue of `queue` takes `envelope` (RabbitMQ's
        `reject-publish` as the RabbitMQ adapter meets it: the delivery waits, held, and
        `queue` delivers nothing new meanwhile), polling every `dead_letter_wait_s`."""
        self._waiting[queue] += 1
        try:
            while not self.dead_letter_fits(queue, envelope):  # noqa: ASYNC110 - no signal
                await asyncio.sleep(self.dead_letter_wait_s)
        finally:
            self._waiting[queue] -= 1
            if not self._waiting[queue]:
                await self._notify(queue)

    def _settle(self, delivery: MemoryDelivery) -> bool:
        return self._in_flight.pop(delivery.tag, None) is not None

    def publish_later(self, destination: str, envelope: Envelope, delay_s: float) -> None:
        """Enqueue a copy after `delay_s` seconds (a late duplicate); counts as pending work."""
        self._later(destination, envelope, 1, delay_s)

    def _later(self, queue: str, envelope: Envelope, attempt: int, delay_s: float) -> None:
        self._delayed += 1

        async def requeue() -> None:
            await asyncio.sleep(delay_s)
            self._delayed -= 1
            await self._put(queue, envelope, attempt)

        self._spawn(requeue())

    async def consume(self, queue_name: str, consumer: str) -> AsyncIterator[MemoryDelivery]:
        """Deliveries of `queue_name` for `consumer`, until `cancel_consumer` (or cancel the
        task: a killed process)."""
        queue = self._queues[queue_name]
        while True:
            async with queue.signal:
                await queue.signal.wait_for(lambda: consumer in self._cancelled or (
                    bool(queue.ready) and not self.blocked(queue_name)))
                if consumer in self._cancelled:
                    queue.signal.notify()  # a publication's wake-up, passed on
                    return
                if self._shuffle is not None:  # out-of-order delivery
                    queue.ready.rotate(-self._shuffle.randrange(len(queue.ready)))
                envelope, attempt = queue.ready.popleft()
            delivery = MemoryDelivery(self, queue_name, envelope, attempt, consumer,
                                      next(self._tags))
            self._in_flight[delivery.tag] = delivery
            yield delivery

    def cancel_consumer(self, queue_name: str, consumer: str) -> None:
        """End `consumer`'s `consume` of `queue_name` (basic.cancel): it takes no new
        delivery; those it holds stay settleable."""
        self._cancelled.add(consumer)
        self._spawn(self._notify(queue_name))

    def drop_consumer(self, consumer: str) -> int:
        """Requeue every unsettled delivery of `consumer` (at the front, as RabbitMQ does);
        returns how many. The consumer's own later settlements of them are ignored."""
        dropped = [d for d in self._in_flight.values() if d.consumer == consumer]
        for d in dropped:
            self._give_back(d)
        return len(dropped)

    def _give_back(self, delivery: MemoryDelivery) -> None:
        """Requeue `delivery` at the front of its queue if it is still in flight."""
        if self._settle(delivery):
            self._queues[delivery._queue].ready.appendleft((delivery.envelope, delivery.attempt))
            self._spawn(self._notify(delivery._queue))

    def idle(self) -> bool:
        """No ready message, none in flight, no delayed retry pending."""
        return (not self._in_flight and self._delayed == 0
                and all(not q.ready for q in self._queues.values()))

    def pending(self) -> dict[str, Any]:
        """What keeps this broker from being idle: ready messages and deliveries in flight
        per queue (non-zero only), and how many delayed retries are waiting."""
        in_flight = Counter(d._queue for d in self._in_flight.values())
        return {"ready": {n: len(q.ready) for n, q in self._queues.items() if q.ready},
                "in flight": dict(in_flight), "delayed retries": self._delayed}

    def depth(self, queue_name: str) -> int:
        """Ready messages in `queue_name`."""
        return len(self._queues[queue_name].ready)
