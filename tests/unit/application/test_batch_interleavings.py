"""Interleavings of the batched token path (application/token_batch.py): two batches sharing
a partition, and a batch racing a single-message attempt on the general path, every schedule
with bounded preemptions and crashes, I1-I9 checked on each (protocol 3.1, 3.4)."""

from __future__ import annotations

import uuid

import pytest

from application.errors import PermanentError, TransientError
from application.processor import Processor
from tests.support.counter import PLAIN_COUNTER, Add
from tests.support.invariants import check, install_probes
from tests.support.scheduler import Choice, GatedPort, Run, explore, run_deliveries
from tests.support.world import World
from tests.unit.application.test_interleavings import LIMIT

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively


async def _scenario(prefix: list[Choice], racing_single: bool) -> tuple[Run, list[str]]:
    """Messages 1 and 2 on partition p, 3 on q. Two batches sharing p ([1, 3] and [copy of 1,
    2]), or (`racing_single`) the batch [1, 2] and a copy of 1 on the general path."""
    world = World(PLAIN_COUNTER, seed=7, colocated=True)
    m1, m2, m3 = [await world.send(Add(p, n), uuid.UUID(int=n))
                  for p, n in (("p", 1), ("p", 2), ("q", 3))]
    deliveries: list[object] = ([[m1, m2], m1] if racing_single else [[m1, m3], [m1, m2]])
    incoming = {m1.message_id, m2.message_id} | (set() if racing_single else {m3.message_id})
    violations = install_probes(world, incoming)
    await world.tokens.create(world.endpoint.name, [m1, m2, m3])  # into the probing store
    if racing_single:
        world.tokens.discard(world.endpoint.name, m3.message_id)
    run = Run(prefix)

    def worker(general: bool) -> object:
        def make(wid: int) -> Processor:
            return world.processor(wrap=lambda name, port: GatedPort(port, run, wid, name),
                                   general=general)
        return make

    await run_deliveries(run, deliveries, worker(general=True),  # type: ignore[arg-type]
                         (TransientError, PermanentError),
                         make_batch_processor=worker(general=False))  # type: ignore[arg-type]
    await world.quiesce()
    violations += check(world, incoming)
    return run, violations


async def _explore(racing_single: bool, preemptions: int, crashes: int) -> tuple[int, list[str]]:
    found: list[str] = []

    async def one(prefix: list[Choice]) -> Run:
        run, violations = await _scenario(prefix, racing_single)
        if violations and not found:
            found.extend(f"schedule {prefix}: {v}" for v in violations)
        return run

    return await explore(one, preemptions, crashes, LIMIT), found


async def test_two_batches_sharing_a_partition_keep_the_invariants() -> None:
    plain, v1 = await _explore(racing_single=False, preemptions=3, crashes=0)
    crashed, v2 = await _explore(racing_single=False, preemptions=2, crashes=1)
    print(f"\ntwo batches: {plain} schedules without crashes, {crashed} with one")
    assert v1 + v2 == []
    assert 200 <= plain < LIMIT
    assert 2500 <= crashed < LIMIT


async def test_a_batch_racing_a_general_path_attempt_keeps_the_invariants() -> None:
    plain, v1 = await _explore(racing_single=True, preemptions=3, crashes=0)
    crashed, v2 = await _explore(racing_single=True, preemptions=2, crashes=1)
    print(f"\nbatch and general path: {plain} schedules without crashes, {crashed} with one")
    assert v1 + v2 == []
    assert 350 <= plain < LIMIT
    assert 4000 <= crashed < LIMIT
