"""The boundary against outside producers (security review, findings 1 and 2), on the counters
service: `front` is a gateway (outbox path) fed by outside producers, `counter` and `audit` are
token endpoints, `bank` an HTTP callee.

- A producer's message ID equal to another endpoint's live token (message IDs are in every
  `message.received` log line) consumed that token through the gateway's `finish`: the real
  message was then acked as a duplicate and lost. Tokens are addressed now.
- A producer's `eo-token` and `eo-request-url` headers, with a live follow-up's ID and URL,
  made the gateway POST and DELETE the callee's stored request. The outbox path honours no
  protocol header now.
- A producer that pre-sent a message ID with its own body made the real message a
  "duplicate". Positive proof keeps the body's hash now: the real one is dead-lettered with
  its reason, never acked silently.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from types import MappingProxyType

import pytest

from application.codec import decode, encode
from application.envelope import REQUEST_URL_HEADER, TOKEN_HEADER, Envelope
from application.errors import MessageIdReused, StateTooLarge
from application.outcome import Outcome
from tests.support.counters.endpoints import Add, AuditLog, Reported, Spend, Tally
from tests.support.counters.harness import counters, outside_envelope, take, token_envelope

ACCOUNT = "c1"


def _forged(message: object, message_id: uuid.UUID, headers: dict[str, str]) -> Envelope:
    """What a hostile outside producer sends to the gateway: a chosen ID and headers."""
    return Envelope(message_id, type(message).__name__, encode(message),
                    MappingProxyType(headers))


async def test_a_producers_message_id_equal_to_a_live_token_leaves_that_token_alone() -> None:
    system = counters()
    system.open_account(ACCOUNT, 500)
    spend = token_envelope(Spend(ACCOUNT, 100), uuid.UUID(int=1))
    await system.tokens.create("counter", [spend])
    assert await system.processor("counter").process(spend) is Outcome.PROCESSED
    follow_up = (await take(system.broker, "counter")).envelope
    assert await system.processor("counter").process(follow_up) is Outcome.PROCESSED
    report = (await take(system.broker, "audit")).envelope  # audit's token is live now
    assert await system.tokens.exists("audit", report.message_id)

    # the exploit: a command to the gateway under the ID of audit's live token
    attack = outside_envelope(Add("c9", 1), report.message_id)
    assert await system.processor("front").process(attack) is Outcome.PROCESSED
    assert await system.tokens.exists("audit", report.message_id)  # audit's token survives
    assert await system.processor("audit").process(report) is Outcome.PROCESSED
    assert system.state("audit", ACCOUNT) == AuditLog((decode(Reported, report.body),))
    assert await system.processor("audit").process(report) is Outcome.DUPLICATE  # once
    relayed = (await take(system.broker, "counter")).envelope  # the command itself went on
    assert decode(Add, relayed.body) == Add("c9", 1)


async def test_a_producers_request_url_header_makes_the_gateway_call_nothing() -> None:
    system = counters()
    system.open_account(ACCOUNT, 500)
    spend = token_envelope(Spend(ACCOUNT, 100), uuid.UUID(int=1))
    await system.tokens.create("counter", [spend])
    assert await system.processor("counter").process(spend) is Outcome.PROCESSED
    (request_id,) = system.requests.requests
    follow_up = (await take(system.broker, "counter")).envelope
    url = follow_up.header(REQUEST_URL_HEADER)
    assert url is not None

    # the exploit: the follow-up's live ID and URL, claimed by an outside producer
    attack = _forged(Add(ACCOUNT, 2), follow_up.message_id,
                     {TOKEN_HEADER: "1", REQUEST_URL_HEADER: url})
    assert await system.processor("front").process(attack) is Outcome.PROCESSED
    assert system.runs("bank") == 0  # never POSTed
    assert await system.requests.exists(request_id)  # stored, unanswered, not DELETEd
    assert await system.tokens.exists("counter", follow_up.message_id)
    relayed = (await take(system.broker, "counter")).envelope
    assert relayed.header(REQUEST_URL_HEADER) is None  # nothing of the claim travels on

    assert await system.processor("counter").process(follow_up) is Outcome.PROCESSED
    assert system.runs("bank") == 1
    tally = system.state("counter", ACCOUNT)
    assert isinstance(tally, Tally)
    assert tally.spent == (100,)
    assert not system.requests.requests  # the real follow-up deleted it, once


async def test_a_known_message_id_with_another_body_is_dead_lettered_not_acked() -> None:
    system = counters()
    message_id = uuid.uuid5(uuid.NAMESPACE_URL, "Add/c1/1")  # a natural ID anyone can derive
    pre_sent = outside_envelope(Add(ACCOUNT, 64), message_id)
    assert await system.processor("front").process(pre_sent) is Outcome.PROCESSED
    real = outside_envelope(Add(ACCOUNT, 1), message_id)
    with pytest.raises(MessageIdReused, match=f"message ID {message_id} reused with another"):
        await system.processor("front").process(real)
    assert await system.processor("front").process(pre_sent) is Outcome.DUPLICATE  # a copy
    assert system.runs("front") == 1


async def test_the_consumer_dead_letters_a_reused_message_id_with_its_reason() -> None:
    system = counters()
    message_id = uuid.uuid4()
    system.broker.publish("front", outside_envelope(Add(ACCOUNT, 64), message_id))
    system.broker.publish("front", outside_envelope(Add(ACCOUNT, 1), message_id))
    consumer = system.consumer("front")
    deliveries = system.broker.consume("front", "test")
    for _ in range(2):
        await consumer.settle(await anext(deliveries))
    await deliveries.aclose()
    (dead,) = system.broker.dead_letters["front"]
    assert dead.header("eo-reason") == f"message ID {message_id} reused with another body"
    assert decode(Add, dead.body) == Add(ACCOUNT, 1)


async def test_a_known_message_id_with_the_same_bytes_but_another_type_is_no_copy() -> None:
    """The duplicate check hashed the body only: a `Spend` with the ID and the very bytes of
    an earlier `Add` was acked as a duplicate and lost (issue 24). The digest covers the
    type and the body."""
    system = counters()
    message_id = uuid.uuid4()
    add = outside_envelope(Add(ACCOUNT, 4), message_id)
    assert await system.processor("front").process(add) is Outcome.PROCESSED
    spend = outside_envelope(Spend(ACCOUNT, 4), message_id)
    assert spend.body == add.body
    with pytest.raises(MessageIdReused):
        await system.processor("front").process(spend)
    assert await system.processor("front").process(add) is Outcome.DUPLICATE
    assert system.runs("front") == 1


async def test_a_producer_cannot_squat_another_producers_message_ids() -> None:
    """A squatter that sends a known ID first with a body of its own made the real command a
    dead letter, and again on replay (issue 24). The gateway's claim is (producer, message
    ID), the producer being the identity the transport authenticated (`Envelope.producer`):
    the squatter's command and the real one are both processed, each once."""
    system = counters()
    message_id = uuid.uuid5(uuid.NAMESPACE_URL, "Add/c1/1")  # a natural ID anyone can derive
    squat = replace(outside_envelope(Add(ACCOUNT, 64), message_id), producer="mallory")
    real = replace(outside_envelope(Add(ACCOUNT, 1), message_id), producer="billing")
    assert await system.processor("front").process(squat) is Outcome.PROCESSED
    assert await system.processor("front").process(real) is Outcome.PROCESSED
    assert await system.processor("front").process(real) is Outcome.DUPLICATE
    assert await system.processor("front").process(squat) is Outcome.DUPLICATE
    anonymous = outside_envelope(Add(ACCOUNT, 2), message_id)  # unauthenticated: its own scope
    assert await system.processor("front").process(anonymous) is Outcome.PROCESSED
    with pytest.raises(MessageIdReused):  # within one producer's scope a reuse is refused
        await system.processor("front").process(replace(real, body=squat.body))
    # a duplicate re-publishes its stored copy: 5 publications of 3 messages
    relayed = {e.message_id: decode(Add, e.body) for e in
               [(await take(system.broker, "counter")).envelope for _ in range(5)]}
    assert sorted(a.amount for a in relayed.values()) == [1, 2, 64]


async def test_a_state_over_the_limit_is_not_committed_and_the_message_dead_lettered() -> None:
    """Issue 24: 60 `AddItem`s of 1 MB each grew one order's state to 44 MB, and a normal
    order sent right after took 6 minutes. A partition's state is bounded
    (`EO_MAX_STATE_BYTES`): the message that would pass the bound is dead-lettered with the
    reason, and the partition keeps the state it had."""
    system = counters(max_state_bytes=450)  # a Tally keeps each message ID: 87 bytes more each
    for n in range(4):
        add = outside_envelope(Add(ACCOUNT, 2 ** n), uuid.uuid4())
        assert await system.processor("front").process(add) is Outcome.PROCESSED
        relayed = (await take(system.broker, "counter")).envelope
        assert await system.processor("counter").process(relayed) is Outcome.PROCESSED
    last = outside_envelope(Add(ACCOUNT, 16), uuid.uuid4())
    assert await system.processor("front").process(last) is Outcome.PROCESSED
    relayed = (await take(system.broker, "counter")).envelope
    with pytest.raises(StateTooLarge, match=r"takes 496 bytes, over the limit of 450 "
                                            r"\(EO_MAX_STATE_BYTES\)"):
        await system.processor("counter").process(relayed)
    assert system.state("counter", ACCOUNT).total == 15  # the four before, not the fifth
