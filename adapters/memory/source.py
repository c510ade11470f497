"""The memory broker's deliveries for one consumer (the `DeliverySource` port), as
`RabbitSource` gives RabbitMQ's: the embedded runtime, the test API and the demo run
`ConsumerProcess` on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from adapters.memory.broker import MemoryBroker, MemoryDelivery


class MemorySource:
    """Deliveries of `queue` on `broker` for consumer `tag`, until `stop`. `on_delivery`
    (optional) sees each delivery before it is yielded: the embedded runtime draws its
    faults (copies, channel losses) there. The memory broker has no prefetch of its own: the
    settler bounds the deliveries in flight. Nothing is dead-lettered here (the memory
    broker holds envelopes already: `dead_lettered` is 0)."""

    dead_lettered = 0

    def __init__(self, broker: MemoryBroker, queue: str, tag: str,
                 on_delivery: Callable[[MemoryDelivery], None] | None = None) -> None:
        self.broker, self.queue, self.tag = broker, queue, tag
        self.on_delivery = on_delivery

    async def start(self, prefetch: int) -> None:
        """Nothing to register: the memory broker delivers once `deliveries` asks."""

    async def deliveries(self, prefetch: int) -> AsyncIterator[MemoryDelivery]:
        """The queue's deliveries until `stop` (see the class docstring)."""
        async for delivery in self.broker.consume(self.queue, self.tag):
            if self.on_delivery is not None:
                self.on_delivery(delivery)
            yield delivery

    async def stop(self) -> None:
        """End `deliveries`; the deliveries yielded stay settleable."""
        self.broker.cancel_consumer(self.queue, self.tag)
