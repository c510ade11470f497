"""A Hypothesis state machine that interleaves deliveries and crashes on the counters'
`counter` endpoint (token path; general and co-located): copies of a few messages of two
partitions are delivered to workers that run concurrently, each stopped at every port call;
a rule lets one worker take its next step, another crashes a worker at the call it waits
on (its delivery comes back later, as a broker redelivers), another runs the sweeper.
At the end every worker runs to completion, every message is delivered once more, time
passes beyond the thresholds, and I1-I10 must hold (tests/support/invariants.py; I10: every
message applied once and consumed, none dead-lettered).

Where the bounded explorations (test_interleavings.py) enumerate every schedule of three
workers on one partition, this walks random schedules of up to six workers on two
partitions, with crashes anywhere and sweeps in between.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from application.envelope import Envelope
from application.errors import Crash, PermanentError, TransientError
from tests.support.counter import COUNTER, Add
from tests.support.invariants import check, install_probes
from tests.support.scheduler import GatedPort, Run
from tests.support.world import World

MESSAGES = [(f"p{i % 2}", 2 ** i) for i in range(4)]
MAX_WORKERS = 6


class InterleavedDeliveries(RuleBasedStateMachine):
    """See the module docstring. Each worker is an asyncio task; `run.waiting` holds the
    future each one waits on at its next port call."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.world: World | None = None
        self.run = Run([])
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.envelopes: list[Envelope] = []
        self.redeliver: list[Envelope] = []
        self.errors: list[str] = []
        self.next_worker = 0

    # set-up ---------------------------------------------------------------------------------

    @precondition(lambda self: self.world is None)
    @rule(colocated=st.booleans())
    def start(self, colocated: bool) -> None:
        self.world = World(COUNTER, seed=5, colocated=colocated)
        self.envelopes = [self._await(self.world.send(Add(p, amount), uuid.UUID(int=i + 1)))
                          for i, (p, amount) in enumerate(MESSAGES)]
        self.violations = install_probes(self.world, {e.message_id for e in self.envelopes})
        for envelope in self.envelopes:  # the probe replaced the token store
            self._await(self.world.tokens.create(self.world.endpoint.name, [envelope]))

    # rules ----------------------------------------------------------------------------------

    @precondition(lambda self: self.world is not None and len(self._live()) < MAX_WORKERS)
    @rule(which=st.integers(0, len(MESSAGES) - 1))
    def deliver(self, which: int) -> None:
        """A copy of message `which` (a duplicate, or a redelivery) reaches a new worker."""
        self._spawn(self.envelopes[which])

    @precondition(lambda self: bool(self.run.waiting))
    @rule(pick=st.integers(0, MAX_WORKERS - 1))
    def step(self, pick: int) -> None:
        """One waiting worker makes its port call and runs to its next one."""
        self._release(pick, crash=False)

    @precondition(lambda self: bool(self.run.waiting))
    @rule(pick=st.integers(0, MAX_WORKERS - 1))
    def crash(self, pick: int) -> None:
        """One waiting worker's process dies at its port call."""
        self._release(pick, crash=True)

    @precondition(lambda self: self.world is not None)
    @rule()
    def sweep(self) -> None:
        """Time passes beyond the stale threshold and the sweeper runs (not gated)."""
        assert self.world is not None
        self.world.clock.advance(timedelta(seconds=31))
        self._await(self.world.sweeper(self.world.processor()).sweep())

    @invariant()
    def no_worker_failed_unexpectedly(self) -> None:
        assert self.errors == []

    # the end --------------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if self.world is not None:
                self._drain()
                for envelope in [*self.redeliver, *self.envelopes]:  # the broker's last word
                    self._spawn(envelope)
                    self._drain()
                self._await(self.world.quiesce())
                incoming = {e.message_id for e in self.envelopes}
                found = self.violations + check(self.world, incoming)
                left = [m for m in incoming if m in self.world.tokens.rows]
                found += [f"I10: {m} never consumed" for m in left]
                assert self.errors == []
                assert found == [], found
        finally:
            for task in self.tasks.values():
                task.cancel()
            self.loop.close()

    # machinery ------------------------------------------------------------------------------

    def _await(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def _live(self) -> list[int]:
        return [w for w, t in self.tasks.items() if not t.done()]

    def _spawn(self, envelope: Envelope) -> None:
        assert self.world is not None
        wid, world, run = self.next_worker, self.world, self.run
        self.next_worker += 1
        processor = world.processor(wrap=lambda name, port: GatedPort(port, run, wid, name))

        async def body() -> None:
            try:
                await processor.process(envelope)
            except Crash:
                self.redeliver.append(envelope)
            except TransientError:  # conflicts beyond the retries: the broker redelivers
                self.redeliver.append(envelope)
            except PermanentError as exc:
                self.errors.append(f"I10: {envelope.message_id} dead-lettered: {exc}")

        self.tasks[wid] = self.loop.create_task(body())
        self._settle()

    def _release(self, pick: int, crash: bool) -> None:
        waiting = sorted(self.run.waiting)
        wid = waiting[pick % len(waiting)]
        self.run.waiting.pop(wid).set_result(crash)
        self._settle()

    def _settle(self) -> None:
        """Run the loop until every worker waits at a port call or is done."""
        async def until_blocked() -> None:
            for _ in range(10_000):
                if all(t.done() or w in self.run.waiting for w, t in self.tasks.items()):
                    return
                await asyncio.sleep(0)
            raise AssertionError("a worker neither finished nor reached a port call")

        self._await(until_blocked())
        for task in self.tasks.values():
            if task.done() and not task.cancelled() and task.exception() is not None:
                self.errors.append(f"worker failed: {task.exception()!r}")

    def _drain(self) -> None:
        """Let every worker run to its end, the lowest-numbered first, never crashing."""
        while self.run.waiting:
            self._release(0, crash=False)


InterleavedDeliveries.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestInterleavedDeliveries = InterleavedDeliveries.TestCase
