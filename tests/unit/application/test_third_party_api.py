"""Calls to third-party APIs through their Idempotency-Key (protocol 12), on memory adapters
and the in-process provider with Stripe-like key semantics (adapters/memory/apis.py): the
failure table's rows for it. Nothing is sent before the commit; the follow-up's message ID
is the key; the provider executes each logical call once; past the key's window nothing is
sent."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest

from adapters.memory.apis import IdempotentProvider, SandboxApis
from application.api_caller import WindowExpired, deadline_of
from application.envelope import API_CALL_HEADER, Envelope
from application.errors import Crash, PermanentError, TransientError
from application.observability import API_CALLED
from application.outcome import Outcome
from application.ports import ApiPolicy, ApiResult
from tests.support.shipping import SHIPPING, Ship, Shipment
from tests.support.world import World

#: tries a few times with no wait: the tests do not sleep for real
POLICY = ApiPolicy(key_retention=timedelta(hours=24), tries=4, backoff_s=(0.0,))


def _world(provider: IdempotentProvider | None = None, policy: ApiPolicy = POLICY,
           apis: object = None) -> tuple[World, IdempotentProvider]:
    provider = provider or IdempotentProvider()
    world = World(SHIPPING, seed=5, apis=apis or SandboxApis(provider),
                  api_policies={"carrier": policy})
    return world, provider


async def _ordered(world: World, order: str = "o-1") -> Envelope:
    """Process `Ship(order)`: returns the follow-up it committed (not yet delivered)."""
    ship = await world.send(Ship(order, 1200))
    assert await world.processor().process(ship) is Outcome.PROCESSED
    [(destination, follow_up)] = [(d, e) for d, e in world.dispatcher.sent
                                  if e.type == "Booked"]
    assert destination == "shipping"
    return follow_up


async def _state(world: World, order: str = "o-1") -> Shipment:
    loaded = await world.store.load(order)
    assert isinstance(loaded.state, Shipment)
    return loaded.state


async def test_the_committed_follow_up_sends_once_with_its_message_id_as_the_key() -> None:
    world, provider = _world()
    follow_up = await _ordered(world)
    assert provider.requests == 0  # nothing is sent before the follow-up's processing
    assert API_CALL_HEADER in follow_up.headers
    assert await world.processor().process(follow_up) is Outcome.PROCESSED
    assert provider.executions == {follow_up.id_text: 1}
    state = await _state(world)
    assert state.status == 201
    assert state.shipment_id == str(uuid.uuid5(uuid.NAMESPACE_URL, follow_up.id_text))
    # a copy of the delivered follow-up is a duplicate: no second request
    assert await world.processor().process(follow_up) is Outcome.DUPLICATE
    assert provider.requests == 1
    assert world.tokens.rows == {}  # nothing at rest
    assert world.events.total(API_CALLED) == 1


async def test_a_crash_after_the_answer_is_redelivered_and_gets_the_stored_answer() -> None:
    world, provider = _world()
    follow_up = await _ordered(world)
    with pytest.raises(Crash):
        await world.processor("after_api_call=crash").process(follow_up)
    assert (await _state(world)).status is None  # not committed
    assert await world.processor().process(follow_up) is Outcome.PROCESSED
    assert provider.requests == 2
    assert provider.executions == {follow_up.id_text: 1}  # the provider executed once
    assert (await _state(world)).answers == 1


async def test_concurrent_copies_of_the_follow_up_execute_once() -> None:
    world, provider = _world(IdempotentProvider(latency_s=0.05),
                             ApiPolicy(timedelta(hours=24), tries=20, backoff_s=(0.02,)))
    follow_up = await _ordered(world)
    outcomes = await asyncio.gather(world.processor().process(follow_up),
                                    world.processor().process(follow_up))
    assert sorted(outcomes) == sorted([Outcome.PROCESSED, Outcome.DUPLICATE])
    assert provider.executions == {follow_up.id_text: 1}
    assert provider.requests >= 3  # the second copy met 409 at least once, then the answer
    assert (await _state(world)).answers == 1


async def test_provider_5xx_then_success_is_retried_with_the_same_key() -> None:
    world, provider = _world(IdempotentProvider(fail_next=2))
    follow_up = await _ordered(world)
    assert await world.processor().process(follow_up) is Outcome.PROCESSED
    assert provider.requests == 3
    assert provider.executions == {follow_up.id_text: 1}


async def test_still_failing_after_the_tries_is_a_transient_error_and_later_succeeds() -> None:
    world, provider = _world(IdempotentProvider(fail_next=5),
                             ApiPolicy(timedelta(hours=24), tries=3, backoff_s=(0.0,)))
    follow_up = await _ordered(world)
    with pytest.raises(TransientError, match="503 after 3 tries"):
        await world.processor().process(follow_up)
    assert await world.processor().process(follow_up) is Outcome.PROCESSED  # redelivered
    assert provider.executions == {follow_up.id_text: 1}


async def test_a_provider_slower_than_the_timeout_answers_409_then_the_stored_answer() -> None:
    provider = IdempotentProvider(latency_s=0.2)
    client = SandboxApis(provider, timeout_s=0.05)  # the request goes on after the timeout
    world, _ = _world(provider, ApiPolicy(timedelta(hours=24), tries=10, backoff_s=(0.05,)),
                      apis=client)
    follow_up = await _ordered(world)
    assert await world.processor().process(follow_up) is Outcome.PROCESSED
    calls = world.events.total(API_CALLED)
    assert calls >= 2  # at least one 409 while the first request ran, then the answer
    assert provider.executions == {follow_up.id_text: 1}
    assert (await _state(world)).status == 201


async def test_past_the_keys_window_nothing_is_sent_and_the_follow_up_dead_letters() -> None:
    world, provider = _world(policy=ApiPolicy(timedelta(minutes=10)))
    follow_up = await _ordered(world)
    deadline = deadline_of(follow_up)
    assert deadline is not None
    assert deadline == world.clock.now() + timedelta(minutes=10)
    world.clock.advance(timedelta(minutes=10))
    with pytest.raises(WindowExpired, match="idempotency window expired"):
        await world.processor().process(follow_up)
    assert provider.requests == 0


async def test_a_losing_attempt_of_the_original_message_sends_nothing() -> None:
    world, provider = _world()
    ship = await world.send(Ship("o-1", 1200))
    with pytest.raises(Crash):  # the handler ran and decided the call; the commit never came
        await world.processor("before_commit=crash").process(ship)
    assert [e for _, e in world.dispatcher.sent if e.type == "Booked"] == []
    assert provider.requests == 0
    assert await world.processor().process(ship) is Outcome.PROCESSED
    [follow_up] = [e for _, e in world.dispatcher.sent if e.type == "Booked"]
    assert await world.processor().process(follow_up) is Outcome.PROCESSED
    assert provider.executions == {follow_up.id_text: 1}


class Scripted:
    """Answers from a script, then 201."""

    def __init__(self, *answers: ApiResult) -> None:
        self.answers, self.sent = list(answers), 0

    async def send(self, api: str, method: str, path: str, body: bytes | None,
                   idempotency_key: str) -> ApiResult:
        self.sent += 1
        return self.answers.pop(0) if self.answers else ApiResult(201, {"id": "s-1"})


async def test_a_422_is_dead_lettered_with_its_reason() -> None:
    world, _ = _world(apis=Scripted(ApiResult(422, {"error": "other body"})))
    follow_up = await _ordered(world)
    with pytest.raises(PermanentError, match="came back with another body"):
        await world.processor().process(follow_up)


async def test_a_429_waits_its_retry_after_then_sends_again() -> None:
    script = Scripted(ApiResult(429, {}, retry_after_s=0.01))
    world, _ = _world(apis=script)
    follow_up = await _ordered(world)
    assert await world.processor().process(follow_up) is Outcome.PROCESSED
    assert script.sent == 2


async def test_a_business_4xx_is_the_handlers_answer() -> None:
    world, _ = _world(apis=Scripted(ApiResult(402, {"id": "declined"})))
    follow_up = await _ordered(world)
    assert await world.processor().process(follow_up) is Outcome.PROCESSED
    assert (await _state(world)).status == 402


async def test_a_call_to_an_api_the_endpoint_does_not_declare_is_refused_at_preparation(
) -> None:
    world = World(SHIPPING, seed=6)  # no APIs
    ship = await world.send(Ship("o-1", 1))
    with pytest.raises(PermanentError, match="declares none"):
        await world.processor().process(ship)
