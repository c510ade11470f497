"""Dead letters an operator acts on (application/dead_letters.py), on the counters service's
memory adapters: a replay after the cause is fixed is processed once, a replay of a processed
message is dropped, a discard leaves nothing at rest, two operators never both act, the
history and the retention. The same against PostgreSQL and RabbitMQ with real processes:
tests/integration/test_dead_letter_process.py."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import timedelta
from types import MappingProxyType

import pytest

from adapters.memory.dead_letter_store import MemoryDeadLetterStore, collect
from application.dead_letter_copies import dead_letter_of
from application.dead_letters import DeadLetters
from application.envelope import API_DEADLINE_HEADER, REASON_HEADER
from application.errors import Crash
from application.observability import DEAD_LETTER_DISCARDED, DEAD_LETTER_REPLAYED
from application.outcome import Outcome
from application.ports import DeadLetterQuery
from application.records import DeadLetter, DeadLetterStatus
from tests.support.counters.endpoints import Add, Spend, Tally
from tests.support.counters.harness import Counters, counters, take, token_envelope

FAILING = "after_handler=raise"  # the cause an operator fixes: every attempt fails


class Desk:
    """The counters service, its dead-letter store and the operations on it."""

    def __init__(self, system: Counters) -> None:
        self.c = system
        self.store = MemoryDeadLetterStore(system.clock)
        self.ops: DeadLetters = system.system.dead_letters(self.store)
        #: the operations' events: (name, fields)
        self.logged: list[tuple[str, dict[str, object]]] = []
        counted = self.ops.events

        class Logged:
            def emit(inner, event: str, **fields: object) -> None:
                self.logged.append((event, fields))
                counted.emit(event, **fields)

        self.ops.events = Logged()

    async def dead_letter(self, message: object, endpoint: str = "counter",
                          failpoints: str = FAILING,
                          headers: dict[str, str] | None = None) -> uuid.UUID:
        """Send `message` (with its token, and `headers`) and have a consumer whose
        processing fails (`failpoints`) dead-letter it on its only attempt; returns its
        message ID."""
        envelope = token_envelope(message, uuid.uuid4())
        if headers:
            envelope = replace(envelope, headers=MappingProxyType({**envelope.headers,
                                                                   **headers}))
        await self.c.tokens.create(endpoint, [envelope])
        self.c.broker.publish(endpoint, envelope)
        consumer = self.c.consumer(endpoint)
        consumer.processor = self.c.worker(endpoint, failpoints)
        consumer.max_attempts = 1
        assert await consumer.settle(await take(self.c.broker, endpoint)) is (
            Outcome.DEAD_LETTERED)
        await self.kept()
        return envelope.message_id

    async def kept(self) -> None:
        """The collector's round: the broker's dead-letter queues into the store."""
        for queue, letters in self.c.broker.dead_letters.items():
            await collect(queue, letters, self.store, self.c.clock)

    async def only(self) -> DeadLetter:
        (letter,) = await self.store.find(DeadLetterQuery(status=None))
        return letter

    async def deliver(self, endpoint: str = "counter") -> Outcome:
        """One delivery of `endpoint`'s queue to a healthy consumer (the cause fixed)."""
        return await self.c.consumer(endpoint).settle(await take(self.c.broker, endpoint))


async def test_a_replay_after_the_fix_is_processed_once_then_refused() -> None:
    desk = Desk(counters())
    m = await desk.dead_letter(Add("c1", 4))
    letter = await desk.only()
    assert (letter.message_id, letter.status, letter.replayable) == (m, DeadLetterStatus.DEAD,
                                                                     True)
    assert letter.reason.startswith("retries exhausted after 1 attempts")
    assert letter.origin_id == str(m)  # no gateway before it: its own ID starts the chain
    assert await desk.ops.token_exists(letter)  # a dead letter keeps its token
    result = await desk.ops.replay(letter.dead_letter_id, "alice")
    assert result.done, result.detail
    assert await desk.deliver() is Outcome.PROCESSED  # the cause is fixed: processed once
    assert desk.c.state("counter", "c1").total == 4
    assert not await desk.c.tokens.exists("counter", m)
    again = await desk.ops.replay(letter.dead_letter_id, "bob")
    assert not again.done
    assert "replayed already (by alice" in again.detail
    assert desk.c.events.total(DEAD_LETTER_REPLAYED) == 1
    assert (await desk.only()).replays == 1


async def test_a_replay_of_a_message_processed_meanwhile_is_dropped_as_a_duplicate() -> None:
    desk = Desk(counters())
    m = await desk.dead_letter(Add("c1", 4))
    copy = token_envelope(Add("c1", 4), m)  # another copy of it, delivered after the fix
    desk.c.broker.publish("counter", copy)
    assert await desk.deliver() is Outcome.PROCESSED
    result = await desk.ops.replay((await desk.only()).dead_letter_id, "alice")
    assert result.done
    assert "its token is gone" in result.detail
    assert await desk.deliver() is Outcome.DUPLICATE
    assert desk.c.state("counter", "c1").total == 4  # once


async def test_a_discard_releases_the_token_the_registrations_and_the_request() -> None:
    """A `Spend` whose attempt registered and created its receipt blob and its request on
    the bank, then failed: the discard takes the registrations over (their artifacts
    deleted), deletes the token, and nothing is left at rest but deferred clean-ups whose
    artifacts are gone."""
    desk = Desk(counters())
    desk.c.open_account("c1", 500)
    m = await desk.dead_letter(Spend("c1", 100), failpoints="after_create:http_request=raise")
    assert desk.c.blobs.objects  # the failed attempt's artifacts
    assert desk.c.requests.requests
    letter = await desk.only()
    result = await desk.ops.discard(letter.dead_letter_id, "alice", "the customer cancelled")
    assert result.done, result.detail
    assert "2 registration(s)" in result.detail
    assert "its token" in result.detail
    assert not await desk.c.tokens.exists("counter", m)
    assert desk.c.store("counter").record_count() == 0
    assert not desk.c.blobs.objects
    assert not desk.c.requests.requests
    assert await desk.c.tokens.count() == 0
    (event,) = [f for name, f in desk.logged if name == DEAD_LETTER_DISCARDED]
    assert (event["by"], event["why"], event["message_id"]) == (
        "alice", "the customer cancelled", str(m))
    assert not (await desk.ops.replay(letter.dead_letter_id, "bob")).done  # discarded
    assert (await desk.only()).status is DeadLetterStatus.DISCARDED


async def test_a_discard_of_a_processed_message_whose_finish_is_pending_is_refused() -> None:
    desk = Desk(counters())
    m = await desk.dead_letter(Add("c1", 1))
    crashed = desk.c.worker("counter", "after_commit=crash")
    with pytest.raises(Crash):  # committed, then the process died before its finish
        await crashed.process(token_envelope(Add("c1", 1), m))
    assert (await desk.c.store("counter").load_tr("c1")).message_id == m
    result = await desk.ops.discard((await desk.only()).dead_letter_id, "alice", "oops")
    assert not result.done
    assert "is committed" in result.detail
    assert await desk.c.tokens.exists("counter", m)  # its finish consumes it


async def test_two_operators_acting_at_once_act_once() -> None:
    desk = Desk(counters())
    await desk.dead_letter(Add("c1", 2))
    letter = await desk.only()
    results = await asyncio.gather(desk.ops.replay(letter.dead_letter_id, "alice"),
                                   desk.ops.replay(letter.dead_letter_id, "bob"),
                                   desk.ops.discard(letter.dead_letter_id, "carol", "dup"))
    assert sum(r.done for r in results) == 1
    assert desk.c.broker.depth("counter") == (1 if (await desk.only()).replays else 0)


async def test_a_message_dead_lettered_again_keeps_one_entry_with_its_history() -> None:
    desk = Desk(counters())
    m = await desk.dead_letter(Add("c1", 2))
    first = await desk.only()
    assert (await desk.ops.replay(first.dead_letter_id, "alice")).done
    desk.c.clock.advance(timedelta(minutes=5))
    consumer = desk.c.consumer("counter")
    consumer.processor = desk.c.worker("counter", FAILING)  # not fixed after all
    consumer.max_attempts = 1
    assert await consumer.settle(await take(desk.c.broker, "counter")) is (
        Outcome.DEAD_LETTERED)
    await desk.kept()
    again = await desk.only()
    assert (again.dead_letter_id, again.message_id, again.status) == (
        first.dead_letter_id, m, DeadLetterStatus.DEAD)
    assert len(again.reasons) == 2


async def test_the_retention_discards_what_nobody_acted_on_and_forgets_the_rest() -> None:
    desk = Desk(counters(dead_letter_retention_days=1))
    waiting = await desk.dead_letter(Add("c1", 1))
    await desk.dead_letter(Add("c2", 2))
    replayed = [d for d in await desk.store.find(DeadLetterQuery()) if d.message_id != waiting]
    assert (await desk.ops.replay(replayed[0].dead_letter_id, "alice")).done
    assert (await desk.ops.gauges()).tokens == 1  # the waiting one's token, counted apart
    desk.c.clock.advance(timedelta(days=2))
    assert await desk.ops.expire() == (1, 1)
    (left,) = await desk.store.find(DeadLetterQuery(status=None))
    assert (left.message_id, left.status, left.acted_by) == (
        waiting, DeadLetterStatus.DISCARDED, "retention")
    assert not await desk.c.tokens.exists("counter", waiting)
    assert (await desk.ops.gauges()).tokens == 0


async def test_a_replay_past_its_third_party_idempotency_window_is_refused() -> None:
    """Protocol 11: a follow-up whose request may no longer be sent (the provider may have
    forgotten its key) is never replayed; an operator discards it."""
    desk = Desk(counters())
    deadline = desk.c.clock.now() + timedelta(minutes=5)
    m = await desk.dead_letter(Add("c1", 4), headers={API_DEADLINE_HEADER: deadline.isoformat()})
    letter = await desk.only()
    desk.c.clock.advance(timedelta(minutes=4))
    assert (await desk.ops.replay(letter.dead_letter_id, "alice")).done  # still in time
    assert await desk.deliver() is Outcome.PROCESSED
    m = await desk.dead_letter(Add("c2", 4), headers={API_DEADLINE_HEADER: deadline.isoformat()})
    [late] = [d for d in await desk.store.find(DeadLetterQuery()) if d.message_id == m]
    desk.c.clock.advance(timedelta(minutes=1))
    refused = await desk.ops.replay(late.dead_letter_id, "alice")
    assert not refused.done
    assert refused.detail.startswith("idempotency window expired")
    assert (await desk.ops.discard(late.dead_letter_id, "alice", "window passed")).done


async def test_a_replay_reads_the_window_its_sender_committed_not_the_copys() -> None:
    """Issue 37 (Low): a message forged straight into an internal queue became a dead letter
    whose replay trusted its forged `eo-api-deadline`. The window is the token's (what the
    sender committed); the dead-letter copy's header is not read when a token exists."""
    desk = Desk(counters())
    expired = desk.c.clock.now() - timedelta(minutes=1)
    forged = desk.c.clock.now() + timedelta(days=365)
    envelope = token_envelope(Add("c1", 4), uuid.uuid4())
    await desk.c.tokens.create("counter", [replace(envelope, headers=MappingProxyType(
        {**envelope.headers, API_DEADLINE_HEADER: expired.isoformat()}))])
    await desk.store.add(dead_letter_of(
        "counter", envelope.id_text, envelope.type, envelope.body,
        {**envelope.headers, API_DEADLINE_HEADER: forged.isoformat(),
         REASON_HEADER: "forged into counter"}, "", desk.c.clock.now()))
    letter = await desk.only()
    assert letter.replayable
    refused = await desk.ops.replay(letter.dead_letter_id, "alice")
    assert not refused.done
    assert refused.detail.startswith(f"idempotency window expired at {expired.isoformat()}")


async def test_a_clipped_dead_letter_cannot_be_replayed_but_can_be_discarded() -> None:
    desk = Desk(counters())
    envelope = replace(token_envelope(Add("c1", 1), uuid.uuid4()), body=b"not json")
    await desk.c.tokens.create("counter", [envelope])  # its sender's bug: the token holds it
    desk.c.broker.publish("counter", envelope)
    assert await desk.deliver() is Outcome.DEAD_LETTERED  # malformed: clipped body
    await desk.kept()
    letter = await desk.only()
    assert not letter.replayable
    refused = await desk.ops.replay(letter.dead_letter_id, "alice")
    assert not refused.done
    assert "cannot be replayed" in refused.detail
    assert (await desk.ops.discard(letter.dead_letter_id, "alice", "garbage")).done
    assert not await desk.c.tokens.exists("counter", envelope.message_id)
    assert desk.c.state("counter", "c1") in (None, Tally())



async def test_a_discarded_follow_up_deletes_its_request_stored_on_the_callee() -> None:
    """A follow-up's request stays on the callee until the follow-up's commit deletes it
    (protocol 6): discarding the follow-up deletes it instead, so nothing is left there."""
    desk = Desk(counters())
    desk.c.open_account("c1", 500)
    spend = token_envelope(Spend("c1", 100), uuid.uuid4())
    await desk.c.tokens.create("counter", [spend])
    desk.c.broker.publish("counter", spend)
    assert await desk.deliver() is Outcome.PROCESSED  # the request is on the bank now
    assert desk.c.requests.requests
    consumer = desk.c.consumer("counter")
    consumer.processor = desk.c.worker("counter", FAILING)  # the follow-up fails
    consumer.max_attempts = 1
    assert await consumer.settle(await take(desk.c.broker, "counter")) is (
        Outcome.DEAD_LETTERED)
    await desk.kept()
    letter = await desk.only()
    assert letter.type == "Spent"
    result = await desk.ops.discard(letter.dead_letter_id, "alice", "paid by hand")
    assert result.done, result.detail
    assert "its stored HTTP request" in result.detail
    assert not desk.c.requests.requests
    assert await desk.c.tokens.count() == 0


async def test_a_discard_reason_over_1000_characters_is_refused_naming_the_limit() -> None:
    """Every entry point (the CLI, the API, the retention) goes through the operations: a
    reason over the bound is refused there, before anything is released, stored or
    logged; one of exactly the bound is taken."""
    desk = Desk(counters())
    await desk.dead_letter(Add("c1", 4))
    letter = await desk.only()
    with pytest.raises(ValueError, match="at most 1000 characters"):
        await desk.ops.discard(letter.dead_letter_id, "alice", "x" * 100_000)
    with pytest.raises(ValueError, match="at most 1000 characters"):
        await desk.ops.discard_many(DeadLetterQuery(), "alice", "x" * 1001)
    assert (await desk.only()).status is DeadLetterStatus.DEAD
    assert await desk.ops.token_exists(letter)  # nothing released
    assert not [e for e, _ in desk.logged if e == DEAD_LETTER_DISCARDED]
    assert (await desk.ops.discard(letter.dead_letter_id, "alice", "y" * 1000)).done
    assert (await desk.only()).discard_reason == "y" * 1000
