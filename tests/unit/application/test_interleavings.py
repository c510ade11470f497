"""Interleavings: two copies of one message and another message of the same partition, every
schedule with bounded preemptions and crashes, I1-I9 checked on each (protocol 3.1, 3.4)."""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Awaitable, Callable

import pytest

from adapters.memory.transactional_store import MemoryTransactionalStore
from application.errors import PermanentError, TransientError
from application.finisher import Finisher
from application.ports import Clear, Committed
from application.processor import Processor
from tests.support.counter import COUNTER, Add
from tests.support.invariants import check, install_probes
from tests.support.scheduler import Choice, GatedPort, Run, explore, run_deliveries
from tests.support.world import World

pytestmark = pytest.mark.slow(minutes=6)  # explores exhaustively

#: Upper bound on schedules per exploration (a safety net: the bounded spaces below are
#: enumerated completely, one schedule of each pair that mirrors the two copies: 2,602 and
#: 13,360 schedules on the general path).
LIMIT = int(os.environ.get("EO_INTERLEAVING_LIMIT", "100000"))


async def _scenario(prefix: list[Choice], copies: int, others: int,
                    finisher: type[Finisher] | None = None,
                    colocated: bool = False,
                    gated: tuple[str, ...] | None = None,
                    store: type[MemoryTransactionalStore] | None = None
                    ) -> tuple[Run, list[str]]:
    world = World(COUNTER, seed=7, colocated=colocated)
    if store is not None:
        world.store.__class__ = store
    m1 = await world.send(Add("p", 1), uuid.UUID(int=1))
    extra = [await world.send(Add("p", 10 + i), uuid.UUID(int=2 + i)) for i in range(others)]
    deliveries = [m1] * copies + extra
    violations = install_probes(world, {e.message_id for e in deliveries})
    for e in deliveries:  # the probe replaced the token store: tokens go in again
        await world.tokens.create(world.endpoint.name, [e])
    run = Run(prefix)

    def make_processor(wid: int) -> Processor:
        processor = world.processor(
            wrap=lambda name, port: GatedPort(port, run, wid, name)
            if gated is None or name in gated else port)
        if finisher is not None:
            processor.finisher.__class__ = finisher
        return processor

    await run_deliveries(run, deliveries, make_processor, (TransientError, PermanentError))
    await world.quiesce()
    violations += check(world, {e.message_id for e in deliveries})
    return run, violations


async def _explore(copies: int, others: int, preemptions: int, crashes: int, limit: int,
                   finisher: type[Finisher] | None = None,
                   stop_at_first: bool = False,
                   colocated: bool = False,
                   gated: tuple[str, ...] | None = None,
                   store: type[MemoryTransactionalStore] | None = None
                   ) -> tuple[int, list[str]]:
    """Every schedule within the bounds; `gated` the ports whose calls are scheduling points
    (None: every port), `finisher`/`store` replace the real ones (defects for self-tests)."""
    found: list[str] = []

    async def one(prefix: list[Choice]) -> Run:
        run, violations = await _scenario(prefix, copies, others, finisher, colocated, gated,
                                          store)
        if violations and not found:
            found.extend([f"schedule {prefix}: {v}" for v in violations])
        return run

    # the copies of one message are interchangeable workers (0 .. copies-1): one schedule
    # of each mirrored pair (tests/support/scheduler.py, children)
    explored = await explore(one, preemptions, crashes, limit,
                             stop=(lambda: bool(found)) if stop_at_first else None,
                             symmetric=(frozenset(range(copies)),))
    return explored, found


async def _twins(prefix: list[Choice], traces: list[tuple[Choice, ...]]) -> Run:
    """Two interchangeable workers (0, 1) and another (2), two scheduling points each; a
    crashed worker is not replaced. Records the schedule's choices."""
    run = Run(prefix)

    def body(name: str) -> Callable[[int], Awaitable[None]]:
        async def steps(wid: int) -> None:
            for n in range(2):
                await run.gate(wid, f"{name}.{n}")
        return steps

    await run.execute({0: body("copy"), 1: body("copy"), 2: body("other")}, lambda _wid: None)
    traces.append(tuple(step.choice for step in run.trace))
    return run


async def test_the_symmetry_reduction_explores_one_of_each_mirrored_pair_and_no_other() -> None:
    """The schedules explored with workers 0 and 1 declared interchangeable are exactly
    the full exploration's with each one's twins swapped when 1 went before 0: none lost
    (every class is covered), none explored twice."""
    full: list[tuple[Choice, ...]] = []
    reduced: list[tuple[Choice, ...]] = []
    await explore(lambda prefix: _twins(prefix, full), 2, 1, LIMIT)
    await explore(lambda prefix: _twins(prefix, reduced), 2, 1, LIMIT,
                  symmetric=(frozenset({0, 1}),))

    def mirrored(trace: tuple[Choice, ...]) -> tuple[Choice, ...]:
        first = next(w for w, _crash in trace if w in (0, 1))
        swap = {0: 1, 1: 0, 2: 2} if first == 1 else {0: 0, 1: 1, 2: 2}
        return tuple((swap[w], crash) for w, crash in trace)

    assert len(set(full)) == len(full)
    assert len(set(reduced)) == len(reduced)
    assert set(reduced) == {mirrored(t) for t in full}
    assert len(reduced) < len(full)


async def test_every_schedule_within_two_preemptions_keeps_the_invariants() -> None:
    explored, violations = await _explore(copies=2, others=1, preemptions=2, crashes=0,
                                          limit=LIMIT)
    print(f"\ninterleavings checked without crashes: {explored}")
    assert violations == []
    assert 1000 <= explored < LIMIT  # the whole bounded space, not a truncated part


async def test_every_schedule_with_one_crash_keeps_the_invariants() -> None:
    explored, violations = await _explore(copies=2, others=1, preemptions=1, crashes=1,
                                          limit=LIMIT)
    print(f"\ninterleavings checked with one crash: {explored}")
    assert violations == []
    assert 1000 <= explored < LIMIT


async def test_co_located_fast_path_keeps_the_invariants_in_every_schedule() -> None:
    """Protocol 3.2's fast path (tokens inserted by the commit, consumed by the clear): every
    schedule with at most 2 preemptions, and every one with a crash and at most 1."""
    plain, v1 = await _explore(copies=2, others=1, preemptions=2, crashes=0, limit=LIMIT,
                               colocated=True)
    crashed, v2 = await _explore(copies=2, others=1, preemptions=1, crashes=1, limit=LIMIT,
                                 colocated=True)
    print(f"\nco-located interleavings checked: {plain} without crashes, {crashed} with one")
    assert v1 + v2 == []
    assert 500 <= plain < LIMIT
    assert 1000 <= crashed < LIMIT


class UnfencedFinisher(Finisher):
    """The defect protocol 3.1 warns about: finish without the (M, A) guard and with an
    unconditional clear."""

    async def finish(self, partition: str, message_id: uuid.UUID, attempt_id: uuid.UUID,
                     committed: object = None, event_fields: object = None) -> bool:
        store = self._store
        _tr, records = await store.load_tr_with_records(partition)
        committed = [r for r in records if r.attempt_id == attempt_id]
        aborted = [r for r in records if r.attempt_id != attempt_id]
        for rec in committed:
            await self.effects.publish(rec.kind, rec.key, rec.payload)
        for rec in aborted:
            await self.effects.clean_up(rec.kind, rec.key, rec.payload)
        current = await store.load_tr(partition)
        await self._consumption.consume_and_clear(
            store, [Clear(partition, current.version, records, aborted, self._clock.now())],
            [message_id], lambda _: None, self._hit)
        return True


async def test_the_exploration_finds_the_unfenced_finish_bug() -> None:
    """The checker is not vacuous: with the fence removed, three workers and no crash break
    I5/I6 (protocol 3.1), and the exploration finds such a schedule."""
    explored, violations = await _explore(copies=2, others=1, preemptions=2, crashes=0,
                                          limit=LIMIT, finisher=UnfencedFinisher,
                                          stop_at_first=True)
    print(f"\nunfenced finish: first violation after {explored} schedules: {violations[0]}")
    assert any(v.split(": ")[1].startswith(("I1", "I5", "I6")) for v in violations)


class HalfFencedFinisher(Finisher):
    """One half of the fence removed: finish without the (M, A) guard, keeping the
    compare-and-clear on the version it read (protocol 3.1 says both halves are needed)."""

    async def finish(self, partition: str, message_id: uuid.UUID, attempt_id: uuid.UUID,
                     committed: Committed | None = None,
                     event_fields: dict[str, str] | None = None) -> bool:
        if committed is None:  # the unguarded read stands for the committer's own
            tr, records = await self._store.load_tr_with_records(partition)
            committed = Committed(tr.version, records)
        return await super().finish(partition, message_id, attempt_id, committed,
                                    event_fields)


class ClearWithoutCompare(MemoryTransactionalStore):
    """The other half removed: the clear ignores the version its caller read."""

    async def clear(self, clear: Clear) -> bool:
        current = self._partition(clear.partition).tr.version
        return await super().clear(dataclasses.replace(clear, expected_version=current))


#: Three workers (two copies and the partition's next message) scheduled at the partition
#: store's calls only: the fence lives there, and gating only it makes a deeper bound
#: affordable (every port gated needs more than 37,000 schedules for the same reach).
_STORE_ONLY = ("store",)


async def test_three_workers_find_a_finish_without_its_attempt_guard() -> None:
    """Every store-level schedule of three workers within three preemptions keeps I1-I9;
    the half-fenced finisher breaks I8 in that space (self-test below), so this exploration
    fails when the guard goes (mutation `finish-without-the-attempt-guard`)."""
    explored, violations = await _explore(copies=2, others=1, preemptions=3, crashes=0,
                                          limit=LIMIT, gated=_STORE_ONLY)
    print(f"\nstore-level schedules of three workers, 3 preemptions: {explored}")
    assert violations == []
    assert 5_000 <= explored < LIMIT


async def test_three_workers_find_a_clear_without_its_compare() -> None:
    """Every store-level schedule with one crash and one preemption keeps I1-I9; a clear
    without its compare breaks them in that space (self-test below)."""
    explored, violations = await _explore(copies=2, others=1, preemptions=1, crashes=1,
                                          limit=LIMIT, gated=_STORE_ONLY)
    print(f"\nstore-level schedules with one crash, 1 preemption: {explored}")
    assert violations == []
    assert 1_000 <= explored < LIMIT


async def test_the_store_level_explorations_find_each_half_of_the_fence_missing() -> None:
    """The two explorations above are not vacuous: each finds its defect."""
    guardless, v1 = await _explore(copies=2, others=1, preemptions=3, crashes=0, limit=LIMIT,
                                   gated=_STORE_ONLY, finisher=HalfFencedFinisher,
                                   stop_at_first=True)
    compareless, v2 = await _explore(copies=2, others=1, preemptions=1, crashes=1,
                                     limit=LIMIT, gated=_STORE_ONLY, store=ClearWithoutCompare,
                                     stop_at_first=True)
    print(f"\nfirst violation: without the attempt guard after {guardless} schedules "
          f"({v1[0] if v1 else None}); without the compare after {compareless} "
          f"({v2[0] if v2 else None})")
    assert v1, "the attempt guard's absence went unnoticed"
    assert v2, "the compare's absence went unnoticed"
