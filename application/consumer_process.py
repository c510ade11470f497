"""One endpoint's consumer process, whatever its transport (FastStream's TestBroker idea: one
application object, two transports). `eo consume` runs it on RabbitMQ
(`adapters.rabbitmq.consumer.RabbitSource`), the embedded runtime, the test API and the demo
on the memory broker (`adapters.memory.source.MemorySource`); `Workers.consumer_process`
assembles it."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from application.outcome import Outcome
from application.ports import DeliverySource
from application.settlement import Settler

#: how long a cancelled background task gets to end before it is cancelled again (seconds)
CANCEL_AGAIN_S = 1.0


async def cancelled(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel `tasks` and wait until every one has ended, cancelling again each one still
    running after `CANCEL_AGAIN_S`: a cancellation that arrives while a library call is in
    progress may be swallowed by it (seen: a dead-letter round finishing after its task was
    cancelled, then sleeping on), and a task that ignored one must not hold the stop for
    ever. Their results and errors are dropped (they are the process's upkeep)."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_S)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" warning


#: A loop beside the consumer (the sweeper, the dead-letter collector, a gateway's inbox
#: relay): runs until cancelled.
Upkeep = Callable[[], Coroutine[Any, Any, None]]


class ConsumerProcess:
    """`settler` settling the deliveries of `source`, at most `prefetch` in flight, with the
    `upkeep` loops running beside it.

    `run()` serves until the source ends (`stop()`, or its broker gone for good), lets the
    deliveries in flight finish (graceful shutdown), then cancels the upkeep loops; it
    raises what the source raised at its end (`BrokerUnavailable` on RabbitMQ) after that.
    The upkeep loops are cancelled for sure (`cancelled`), their errors dropped (each loop
    logs its own). Cancelling `run()`'s task instead is a `kill -9`: the deliveries in
    flight stop where they stand and go back to the queue with the channel (the embedded
    runtime's crash).
    `settled()` counts every delivery taken: the settler's outcomes plus what the source
    dead-lettered before processing, in one vocabulary (`Outcome`)."""

    def __init__(self, endpoint: str, settler: Settler, source: DeliverySource, prefetch: int,
                 upkeep: Sequence[Upkeep] = ()) -> None:
        if prefetch < 1:
            raise ValueError(f"prefetch {prefetch} < 1")
        self.endpoint, self.settler, self.source = endpoint, settler, source
        self.prefetch = prefetch
        self.upkeep = tuple(upkeep)

    @property
    def batch_size(self) -> int:
        """Deliveries processed as one unit (1 when the settler does not batch)."""
        return self.settler.batch_size if self.settler.batches else 1

    async def start(self) -> None:
        """Consume now (`run` does it otherwise). Raises `TransientError` when the work
        queue cannot be consumed."""
        await self.source.start(self.prefetch)

    async def run(self) -> None:
        """Serve until the source ends; see the class docstring."""
        background = [asyncio.create_task(work()) for work in self.upkeep]
        try:
            await self.settler.serve(self.source.deliveries(self.prefetch), self.prefetch)
        finally:
            await cancelled(background)

    async def stop(self) -> None:
        """Take no new delivery: `run` returns once those in flight are settled."""
        await self.source.stop()

    def settled(self) -> Counter[Outcome]:
        """The settlements so far, the source's own dead letters included."""
        counts = Counter(self.settler.counts)
        if self.source.dead_lettered:
            counts[Outcome.DEAD_LETTERED] += self.source.dead_lettered
        return counts
