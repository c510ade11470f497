"""The embedded runtime: every consuming endpoint's consumers on the memory broker in this
process, with the faults a production broker and crashing processes bring (copies,
redeliveries, deliveries out of order, several consumers per endpoint, failpoints whose
`crash` kills the whole service). A crash ends the running generation of consumers, as
`kill -9` ends a process: its tasks are cancelled where they stand, their unsettled deliveries
go back to their queues, and a new generation starts on the same stores. The public test API
(entrypoints/testing.py) and `eo embedded` run on it."""

from __future__ import annotations

import asyncio
import contextvars
import random
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from adapters.memory.broker import MemoryBroker, MemoryDelivery
from adapters.memory.source import MemorySource
from application.consumer_process import ConsumerProcess
from application.errors import Crash
from application.failpoints import Failpoints
from application.outcome import Outcome
from application.ports import DeliverySource

#: The consumers' generation a task belongs to (set for a generation's consumer tasks and
#: inherited by every task they create), so that a crash cancels exactly those.
_GENERATION: contextvars.ContextVar[set[asyncio.Task[Any]] | None] = contextvars.ContextVar(
    "eo_testing_generation", default=None)


@dataclass(frozen=True)
class Faults:
    """What the run meets, drawn from `seed`.

    - `duplicates`: the chance (0 <= p < 1) that a message's first delivery to a queue is
      followed by a copy of it (a producer's retry, a re-publication);
    - `redeliveries`: the chance (0 <= p < 1) that the consumer taking a message's first
      delivery to a queue loses its channel a few milliseconds later: every unsettled
      delivery of that consumer goes back to its queue and is delivered again, maybe while
      the first copy is still being processed (concurrent attempts);
    - `out_of_order`: each delivery is taken from a random place in its queue;
    - `workers`: consumers per endpoint (>= 1);
    - `failpoints`: `EO_FAILPOINTS` rules (application/failpoints.py), e.g.
      `"after_commit=crash@2;after_put=raise@1"`; `crash` kills the service (module
      docstring), `drop_conn` makes every consumer lose its channel.

    Raises ValueError naming the field when a value is out of range or a rule is bad."""

    seed: int = 0
    duplicates: float = 0.0
    redeliveries: float = 0.0
    out_of_order: bool = False
    workers: int = 1
    failpoints: str = ""

    def __post_init__(self) -> None:
        for name in ("duplicates", "redeliveries"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"Faults.{name}: a chance in [0, 1), not "
                                 f"{getattr(self, name)!r}")
        if self.workers < 1:
            raise ValueError(f"Faults.workers: at least 1, not {self.workers!r}")
        Failpoints.from_spec(self.failpoints, _never)  # raises ValueError naming the rule


def _never(name: str) -> None:
    raise AssertionError(name)




def generation_task_factory(loop: asyncio.AbstractEventLoop, coro: Any,
                             context: contextvars.Context | None = None) -> asyncio.Task[Any]:
    """The event loop's task factory while a service runs: a task created by a task of a
    consumers' generation (or in its context) joins that generation."""
    task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, context=context)
    generation = context.get(_GENERATION) if context is not None else _GENERATION.get()
    if generation is not None:
        generation.add(task)
        task.add_done_callback(lambda done: _forget(generation, done))
    return task


def _forget(generation: set[asyncio.Task[Any]], task: asyncio.Task[Any]) -> None:
    """A generation's task ended: drop it, its exception retrieved (an injected `Crash` is
    how it was meant to end; anything else is re-raised where the consumer awaits it)."""
    generation.discard(task)
    if not task.cancelled():
        task.exception()


class EmbeddedRuntime:
    """The consumer processes of `consuming` endpoints on `broker` with `faults`:
    `process_of(name, source)` makes one of endpoint `name` (its own processor) on a
    source, as `eo consume` makes one on RabbitMQ (`Workers.consumer_process`). The event
    loop's task factory must be `generation_task_factory` while it runs
    (`EmbeddedService.start` sets it)."""

    def __init__(self, broker: MemoryBroker, faults: Faults, consuming: Iterable[str],
                 process_of: Callable[[str, DeliverySource], ConsumerProcess]) -> None:
        self.broker, self.faults, self.consuming = broker, faults, list(consuming)
        self.process_of = process_of
        self._rng = random.Random(faults.seed)
        #: (queue, message ID) whose first delivery drew its faults already
        self._faulted: set[tuple[str, uuid.UUID]] = set()
        self.crashed = asyncio.Event()
        #: the crashes injected so far
        self.crashes = 0
        #: settlements per endpoint of the generations that ended (`settled` adds the
        #: running one's)
        self.counts: dict[str, Counter[Outcome]] = {name: Counter() for name in self.consuming}
        self._processes: dict[str, tuple[str, ConsumerProcess]] = {}  # tag -> endpoint, it
        self._generation: set[asyncio.Task[Any]] = set()
        self._generations = 0

    def settled(self) -> dict[str, Counter[Outcome]]:
        """Settlements per endpoint so far, the running generation's included."""
        counts = {name: Counter(c) for name, c in self.counts.items()}
        for name, process in self._processes.values():
            counts[name].update(process.settled())
        return counts

    async def surviving(self, work: Callable[[], Awaitable[Any]]) -> None:
        """Run `work()` (a sweep, a relay) until it ends without an injected crash: a crash
        there kills the service too; the work is done again by the restarted one."""
        while True:
            try:
                await work()
                return
            except Crash:
                await self.restart()

    async def until_quiet(self, quiet_polls: int) -> None:
        """Wait until the broker has been idle for `quiet_polls` polls 10 ms apart, restarting
        the consumers after each injected crash."""
        quiet = 0
        while quiet < quiet_polls:
            await asyncio.sleep(0.01)
            if self.crashed.is_set():
                await self.restart()
                quiet = 0
                continue
            quiet = quiet + 1 if self.broker.idle() else 0

    def crash(self, name: str) -> None:
        """The `crash` failpoint action: the service dies here (the caller's task ends with
        `Crash`); `restart` cancels the rest of its generation."""
        self.crashes += 1
        self.crashed.set()
        current = asyncio.current_task()
        for task in self._generation:  # the others stop at their next await, as if killed
            if task is not current:
                task.cancel()
        raise Crash(name)

    async def drop_connection(self) -> None:
        """The `drop_conn` failpoint action: every consumer loses its channel."""
        for tag in list(self._processes):
            self.broker.drop_consumer(tag)

    async def restart(self) -> None:
        """The service restarted: the running generation killed, a new one started."""
        await self.stop_generation()
        self.crashed.clear()
        self.start_generation()

    def start_generation(self) -> None:
        """A new generation of consumers: `Faults.workers` per consuming endpoint."""
        self._generations += 1
        self._generation = set()
        token = _GENERATION.set(self._generation)
        try:
            for name in self.consuming:
                for worker in range(self.faults.workers):
                    tag = f"{name}-{self._generations}-{worker}"
                    process = self.process_of(name, MemorySource(
                        self.broker, name, tag, partial(self._draw_faults, name, tag)))
                    self._processes[tag] = (name, process)
                    self._generation.add(asyncio.create_task(process.run()))
        finally:
            _GENERATION.reset(token)

    async def stop_generation(self) -> None:
        """Cancel every task of the running generation where it stands, put their unsettled
        deliveries back, and keep their settlement counts."""
        tasks = list(self._generation)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for tag, (name, process) in self._processes.items():
            self.broker.drop_consumer(tag)
            self.counts[name].update(process.settled())
        self._processes = {}

    def _draw_faults(self, queue: str, tag: str, delivery: MemoryDelivery) -> None:
        """The faults of a message's first delivery to `queue` (to consumer `tag`): a copy
        of it, a channel loss a few milliseconds later."""
        first = (queue, delivery.envelope.message_id) not in self._faulted
        faults = self.faults
        if first and (faults.duplicates or faults.redeliveries):
            # a message's first delivery only: faults drawn on every delivery would breed
            # (each channel loss redelivers the consumer's whole prefetch, each redelivery a
            # new chance of a copy and of another loss) and, with many deliveries in
            # flight, never end
            self._faulted.add((queue, delivery.envelope.message_id))
            if faults.duplicates and self._rng.random() < faults.duplicates:
                self.broker.publish(queue, delivery.envelope)
            if faults.redeliveries and self._rng.random() < faults.redeliveries:
                asyncio.get_running_loop().call_later(
                    self._rng.uniform(0.0, 0.02), self.broker.drop_consumer, tag)
