"""Invariants I1-I9 of protocol 1, checked on a `World` running the counter endpoint."""

from __future__ import annotations

import uuid
from collections import defaultdict

from adapters.memory.token_store import MemoryTokenStore
from application.codec import decode
from application.envelope import Envelope
from tests.support.counter import Added, Tally
from tests.support.world import World


class ProbedTokenStore(MemoryTokenStore):
    """Checks I6 at the moment a token is consumed: everything its message published is
    visible (output dispatched, blob stored)."""

    def __init__(self, world: World, incoming: set[uuid.UUID]) -> None:
        super().__init__()
        self.world, self.incoming, self.violations = world, incoming, []

    def discard(self, endpoint: str, message_id: uuid.UUID) -> None:
        if message_id in self.incoming and self.holds(endpoint, message_id):
            outs = [o for o in outputs(self.world) if o.incoming == str(message_id)]
            if not outs:
                self.violations.append(f"I6: {message_id} consumed before its output")
            for out in outs:
                if out.blob_key and out.blob_key not in self.world.blobs.objects:
                    self.violations.append(f"I6: {message_id} consumed before its blob")
        super().discard(endpoint, message_id)


def outputs(world: World) -> list[Added]:
    """Every `Added` the world's dispatcher published, copies included."""
    return [decode(Added, env.body) for _, env in world.dispatcher.sent]


def install_probes(world: World, incoming: set[uuid.UUID]) -> list[str]:
    """Install the I4 (at dispatch) and I6 (at consume) probes; returns their violations."""
    probe = ProbedTokenStore(world, incoming)
    world.use_tokens(probe)
    violations = probe.violations

    def at_dispatch(_destination: str, envelope: Envelope) -> None:
        out = decode(Added, envelope.body)
        state = world.store.partitions[out.partition].state
        if state is None or out.incoming not in state.applied:
            violations.append(f"I4: output of {out.incoming} visible before its commit")

    world.dispatcher.on_dispatch = at_dispatch
    return violations


def check(world: World, incoming: set[uuid.UUID], all_consumed: bool = True) -> list[str]:
    """Violations of I1-I9 at quiescence (empty when all hold)."""
    v: list[str] = []
    states: dict[str, Tally] = world.store.states()
    applied = [m for s in states.values() for m in s.applied]
    for m in incoming:  # I1 (and, at quiescence, every message applied once)
        n = applied.count(str(m))
        if n > 1 or (all_consumed and n != 1):
            v.append(f"I1: {m} applied {n} times")
    copies: dict[uuid.UUID, set[tuple[str, bytes]]] = defaultdict(set)
    for _, env in world.dispatcher.sent:
        copies[env.message_id].add((env.type, env.body))
    v += [f"I2: {len(c)} different copies of {mid}" for mid, c in copies.items() if len(c) > 1]
    by_incoming: dict[str, set[uuid.UUID]] = defaultdict(set)
    for _, env in world.dispatcher.sent:
        out = decode(Added, env.body)
        by_incoming[out.incoming].add(env.message_id)
        state = states.get(out.partition)
        if state is None or out.incoming not in state.applied:
            v.append(f"I4: output of uncommitted {out.incoming}")
            continue
        i = state.applied.index(out.incoming)
        if out.applied != state.applied[: i + 1]:
            v.append(f"I3: output of {out.incoming} does not match the committed state")
        if out.blob_key != state.blobs[i]:
            v.append(f"I7: output of {out.incoming} names a blob of another attempt")
    for m in applied:  # I5
        if len(by_incoming.get(m, ())) != 1:
            v.append(f"I5: {m} has {len(by_incoming.get(m, ()))} distinct outputs")
    committed_blobs = {b for s in states.values() for b in s.blobs if b}  # "": no blob
    if set(world.blobs.objects) != committed_blobs:  # I8
        v.append(f"I8: blobs {sorted(set(world.blobs.objects) ^ committed_blobs)} differ")
    out_ids = {mid for ids in by_incoming.values() for mid in ids}
    if all_consumed:
        left = set(world.tokens.rows) - out_ids
        if left:
            v.append(f"I8/I9: tokens left {sorted(map(str, left))}")
        if out_ids - set(world.tokens.rows):
            v.append("I5: an output's token is missing")
        if world.store.record_count() or world.store.cleanups:
            v.append("I8: side-effect records or deferred clean-ups left")
        if any(p.tr.is_committed for p in world.store.partitions.values()):
            v.append("I5: a committed transaction was never finished")
    return v
