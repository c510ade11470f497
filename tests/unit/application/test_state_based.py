"""The state strategy (application/state_path.py): duplicates re-evaluated against the state
before their first processing, byte-identical re-publication, one entry per message under
every bounded interleaving, retention, and the start-up refusals."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest

from application.codec import encode
from application.envelope import TOKEN_HEADER, Envelope
from application.errors import MessageIdReused, OutsideRetention, PermanentError, TransientError
from application.observability import HANDLER_INVOKED
from application.outcome import Outcome
from application.registry import Registration, Registry, RegistryError
from application.state_path import StateRetention, outgoing_id
from application.strategy import Strategy
from domain.context import Context
from entrypoints.service_spec import resolve_service
from entrypoints.settings import SettingsError, load_settings
from tests.support.counter import COUNTER, Add
from tests.support.counters.endpoints import AUDIT
from tests.support.counters.registry import REGISTRY
from tests.support.scheduler import Choice, GatedPort, Run, explore, run_deliveries
from tests.support.set_algebra import SET_ALGEBRA, AddMember, Members, RemoveMember
from tests.support.world import StateWorld


def _out(incoming: uuid.UUID, index: int = 0) -> uuid.UUID:
    return outgoing_id(incoming, SET_ALGEBRA.name, index)


async def test_a_late_duplicate_sees_the_state_before_it_and_republishes_identical_bytes() -> None:
    world = StateWorld()
    worker = world.processor()
    m1 = await world.envelope(AddMember("p", "a"), 1)
    m2 = await world.envelope(AddMember("p", "b"), 2)
    assert await worker.process(m1) is Outcome.PROCESSED
    world.clock.advance(timedelta(hours=1))
    assert await worker.process(m2) is Outcome.PROCESSED
    world.clock.advance(timedelta(hours=1))
    first = world.published(_out(m1.message_id))
    assert await world.processor().process(m1) is Outcome.DUPLICATE
    again = world.published(_out(m1.message_id))
    assert len(first) == 1
    assert again == first * 2  # byte-identical: same ID, type, body (members, time, attempt)
    assert b'"members":["a"]' in first[0][2]  # evaluated against the state before m1: {}
    assert world.state() == Members(("a", "b"))
    assert [e.message_id for e in world.stream.entries["p"]] == [m1.message_id, m2.message_id]
    assert world.events.total(HANDLER_INVOKED) == 2  # the duplicate's replay is not a run


async def test_a_duplicate_add_after_the_remove_does_not_add_again() -> None:
    world = StateWorld()
    worker = world.processor()
    add = await world.envelope(AddMember("p", "x"), 1)
    remove = await world.envelope(RemoveMember("p", "x"), 2)
    add_y = await world.envelope(AddMember("p", "y"), 3)
    for env in (add, remove, add, add_y, remove, add):
        await worker.process(env)
    assert world.state() == Members(("y",))
    assert [e.state for e in world.stream.entries["p"]] == [
        Members(("x",)), Members(()), Members(("y",))]
    assert len({body for *_x, body, _h in world.published(_out(add.message_id))}) == 1
    assert len({body for *_x, body, _h in world.published(_out(remove.message_id))}) == 1


async def test_an_unchanged_state_still_gets_an_entry() -> None:
    world = StateWorld()
    worker = world.processor()
    await worker.process(await world.envelope(RemoveMember("p", "nothing"), 1))
    await worker.process(await world.envelope(AddMember("p", "a"), 2))
    await worker.process(await world.envelope(AddMember("p", "a"), 3))  # no change
    assert [e.version for e in world.stream.entries["p"]] == [1, 2, 3]
    assert world.stream.entries["p"][2].state == world.stream.entries["p"][1].state


async def test_two_concurrent_copies_commit_once() -> None:
    world = StateWorld()
    m1 = await world.envelope(AddMember("p", "a"), 1)
    outcomes = await asyncio.gather(world.processor().process(m1),
                                    world.processor().process(m1))
    assert sorted(outcomes) == [Outcome.DUPLICATE, Outcome.PROCESSED]
    assert len(world.stream.entries["p"]) == 1
    assert len({tuple(p) for p in world.published(_out(m1.message_id))}) == 1
    assert await world.tokens.count() == 0


async def test_a_token_header_is_not_honoured_and_no_token_is_consumed() -> None:
    """Senders create no token for a state receiver: a delivery claiming one is processed
    from its own body and deduplicated by the stream, and a token of the same ID (addressed
    to another endpoint) is neither read nor consumed."""
    world = StateWorld()
    worker = world.processor()
    m1 = await world.envelope(AddMember("p", "a"), 1, token=True)
    assert await worker.process(m1) is Outcome.PROCESSED
    assert await world.tokens.exists("elsewhere", m1.message_id)
    assert await worker.process(m1) is Outcome.DUPLICATE  # re-published, byte-identical
    assert len(world.published(_out(m1.message_id))) == 2
    assert len(set(world.published(_out(m1.message_id)))) == 1
    # a copy after a crash between the append and the publication re-publishes
    m2 = await world.envelope(AddMember("p", "b"), 2)
    await world.stream.append("p", 1, m2.message_id, Members(("a", "b")),
                              {"now": world.clock.now().isoformat(),
                               "attempt_id": str(uuid.UUID(int=99))})
    assert await worker.process(m2) is Outcome.DUPLICATE
    assert len(world.published(_out(m2.message_id))) == 1
    assert await world.tokens.count() == 1


async def test_a_known_message_id_with_another_body_is_dead_lettered_not_acked() -> None:
    """Positive proof keeps the body's hash: the same ID with another body is not a copy
    (a producer that pre-sent the ID), so it is a permanent error with its reason."""
    world = StateWorld()
    worker = world.processor()
    m1 = await world.envelope(AddMember("p", "a"), 1)
    assert await worker.process(m1) is Outcome.PROCESSED
    forged = Envelope(m1.message_id, m1.type, encode(AddMember("p", "z")))
    with pytest.raises(MessageIdReused, match="reused with another body"):
        await worker.process(forged)
    assert world.stream.entries["p"][-1].state == Members(("a",))
    assert len(world.published(_out(m1.message_id))) == 1  # nothing re-published for it
    assert await worker.process(m1) is Outcome.DUPLICATE  # the real copy still is one


async def test_outputs_carry_derived_ids_and_no_token() -> None:
    world = StateWorld()
    m1 = await world.envelope(AddMember("p", "a"), 1)
    await world.processor().process(m1)
    [(destination, env)] = world.dispatcher.sent
    assert destination == "audit"
    assert env.message_id == uuid.uuid5(m1.message_id, "sets/0")
    assert env.header(TOKEN_HEADER) is None
    assert world.tokens.rows == {}


async def test_truncation_keeps_duplicates_inside_the_window_correct() -> None:
    world = StateWorld()
    worker = world.processor()
    envs = [await world.envelope(AddMember("p", x), i + 1) for i, x in enumerate("abc")]
    for env in envs:  # appended at day 0, 10 and 20
        await worker.process(env)
        world.clock.advance(timedelta(days=10))
    first = [world.published(_out(e.message_id)) for e in envs]
    world.clock.advance(timedelta(days=-9))  # day 21: the cutoff of 7 days is day 14
    dropped = await StateRetention(world.stream, world.clock, timedelta(days=7)).sweep()
    assert dropped == 1  # a: its successor b (day 10) is older than the cutoff
    assert [e.version for e in world.stream.entries["p"]] == [2, 3]
    # c is inside the window: evaluated against b's snapshot, re-published identically
    assert await worker.process(envs[2]) is Outcome.DUPLICATE
    assert world.published(_out(envs[2].message_id)) == first[2] * 2
    # b is outside the window and its predecessor is gone: refused, never applied twice
    with pytest.raises(OutsideRetention):
        await worker.process(envs[1])
    # new messages carry on from the latest snapshot, which truncation always keeps
    await worker.process(await world.envelope(RemoveMember("p", "a"), 9))
    assert world.state() == Members(("b", "c"))
    world.clock.advance(timedelta(seconds=1))
    assert await StateRetention(world.stream, world.clock, timedelta(days=0)).sweep() == 2
    assert [e.version for e in world.stream.entries["p"]] == [4]


async def test_artifacts_and_rejections_append_nothing() -> None:
    world = StateWorld(endpoint=COUNTER)  # creates a blob per message
    with pytest.raises(PermanentError, match="state strategy"):
        await world.processor().process(await world.envelope(Add("p", 1), 1))
    assert world.stream.entries.get("p", []) == []
    sets = StateWorld()
    with pytest.raises(PermanentError, match="forbidden"):
        await sets.processor().process(await sets.envelope(AddMember("p", "forbidden"), 1))
    assert sets.stream.entries.get("p", []) == []
    assert sets.dispatcher.sent == []


def test_wiring_refuses_state_endpoints_sending_to_token_receivers_or_using_artifacts() -> None:
    # the counters: audit may use state; counter may not (blobs, a callee, audit on token)
    settings = load_settings(strategies={"audit": "state"})
    assert resolve_service(settings, REGISTRY).strategy("audit") is Strategy.STATE
    with pytest.raises(SettingsError, match="EO_STRATEGIES: counter=state") as caught:
        resolve_service(load_settings(strategies={"counter": "state"}), REGISTRY)
    assert "counter=state: it creates blobs" in str(caught.value)
    assert "counter=state sends to audit, which uses 'token'" in str(caught.value)
    # a state sender without artifacts: fine towards an outbox or state receiver only
    sets = Registry("sets", (Registration(SET_ALGEBRA), Registration(AUDIT)))
    assert sets.strategies({"sets": "state", "audit": "outbox"})["sets"] is Strategy.STATE
    assert sets.strategies({"sets": "state", "audit": "state"})["audit"] is Strategy.STATE
    with pytest.raises(RegistryError, match="sets=state sends to audit, which uses 'token'"):
        sets.strategies({"sets": "state"})


# --- every bounded interleaving of two copies and another message ----------------------------

LIMIT = 20_000


async def _scenario(prefix: list[Choice]) -> tuple[Run, list[str]]:
    world = StateWorld()
    m1 = await world.envelope(AddMember("p", "a"), 1)
    m2 = await world.envelope(AddMember("p", "b"), 2)
    deliveries = [m1, m1, m2]
    run = Run(prefix)
    await run_deliveries(
        run, deliveries,
        lambda wid: world.processor(wrap=lambda name, port: GatedPort(port, run, wid, name)),
        (TransientError, PermanentError))
    return run, _violations(world, [m1, m2])


def _violations(world: StateWorld, messages: list[Envelope]) -> list[str]:
    out = []
    entries = world.stream.entries.get("p", [])
    ids = [e.message_id for e in entries]
    if sorted(ids) != sorted(m.message_id for m in messages):
        out.append(f"one entry per message: {ids}")
    state: Any = None
    decoded = {m.message_id: SET_ALGEBRA.messages[m.type](**json.loads(m.body))
               for m in messages}
    for entry in entries:  # each snapshot is the handler applied to the one before it
        ctx = Context(entry.message_id, uuid.UUID(entry.recorded["attempt_id"]),
                      datetime.fromisoformat(entry.recorded["now"]))
        decision = SET_ALGEBRA.handle(state, decoded[entry.message_id], ctx)
        if decision.state != entry.state:
            out.append(f"entry v{entry.version} is not its message applied to v{entry.version-1}")
        state = entry.state
        copies = {tuple(p) for p in world.published(_out(entry.message_id))}
        if len(copies) != 1:
            out.append(f"outputs of {entry.message_id}: {len(copies)} distinct versions")
    if world.tokens.rows:
        out.append(f"tokens left: {len(world.tokens.rows)}")
    return out


async def _explore(preemptions: int, crashes: int) -> tuple[int, list[str]]:
    found: list[str] = []

    async def one(prefix: list[Choice]) -> Run:
        run, violations = await _scenario(prefix)
        if violations and not found:
            found.extend(f"schedule {prefix}: {v}" for v in violations)
        return run

    return await explore(one, preemptions, crashes, LIMIT), found


async def test_every_schedule_within_two_preemptions_keeps_one_entry_per_message() -> None:
    explored, violations = await _explore(preemptions=2, crashes=0)
    print(f"\nstate strategy interleavings checked: {explored}")
    assert violations == []
    assert 100 <= explored < LIMIT  # the whole bounded space


async def test_every_schedule_with_one_crash_keeps_one_entry_per_message() -> None:
    explored, violations = await _explore(preemptions=1, crashes=1)
    print(f"\nstate strategy interleavings with one crash: {explored}")
    assert violations == []
    assert 100 <= explored < LIMIT
