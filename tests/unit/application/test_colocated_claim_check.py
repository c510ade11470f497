"""The token path with co-located tokens reads the claim check with the transaction record
(application/token_path.py): one statement fewer per message, and the token's message still
decides what is processed."""

from __future__ import annotations

import uuid
from collections import Counter
from types import MappingProxyType

from application.codec import encode
from application.envelope import Envelope
from application.outcome import Outcome
from tests.support.counter import PLAIN_COUNTER, Add
from tests.support.invariants import check, install_probes
from tests.support.world import World
from tests.unit.application.test_token_batch import Counting


def _envelope(n: int, body: bytes) -> Envelope:
    return Envelope(uuid.UUID(int=n), "Add", body, MappingProxyType({"eo-token": "1"}))


async def _processed(colocated: bool, delivered: Envelope, token: Envelope
                     ) -> tuple[World, Outcome, Counter[str], list[str]]:
    world = World(PLAIN_COUNTER, seed=3, colocated=colocated)
    violations = install_probes(world, {token.message_id})
    await world.tokens.create(world.endpoint.name, [token])
    calls: Counter[str] = Counter()
    processor = world.processor(wrap=lambda name, port: Counting(port, calls)
                                if name in ("store", "tokens") else port)
    outcome = await processor.process(delivered)
    await world.quiesce()
    return world, outcome, calls, violations + check(world, {token.message_id})


async def test_the_token_is_read_with_the_transaction_record() -> None:
    message = _envelope(1, encode(Add("a", 5)))
    for colocated, token_reads in ((True, 0), (False, 1)):
        world, outcome, calls, violations = await _processed(colocated, message, message)
        assert outcome is Outcome.PROCESSED
        assert violations == []
        assert calls["get"] == token_reads, colocated
        assert calls["load"] == 1
        assert world.store.states()["a"].total == 5


async def test_a_delivery_that_is_not_the_tokens_message_is_processed_as_the_token_says(
) -> None:
    token = _envelope(2, encode(Add("a", 5)))
    for body in (encode(Add("b", 500)), b"not json"):  # another message, or none at all
        world, outcome, calls, violations = await _processed(True, _envelope(2, body), token)
        assert outcome is Outcome.PROCESSED
        assert violations == []
        assert world.store.states()["a"].total == 5
        assert "b" not in world.store.states()
        assert calls["get"] == 1  # the general way: the token's body, then its partition


async def test_a_delivery_without_its_token_is_a_duplicate_and_writes_nothing() -> None:
    world = World(PLAIN_COUNTER, seed=3, colocated=True)
    outcome = await world.processor().process(_envelope(3, encode(Add("a", 5))))
    assert outcome is Outcome.DUPLICATE
    assert world.store.states().get("a") is None
    # its partition, named by a body nobody vouched for, got no transaction record
    assert "a" not in world.store.partitions
