"""HTTP request/response exactly once (protocol 6): the counters' `bank` callee and the
`counter` endpoint calling it (`Spend`, follow-up `Spent`)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from adapters.memory.broker import MemoryBroker, MemoryDelivery
from application.assembly import build_callee
from application.codec import decode, encode
from application.envelope import REQUEST_URL_HEADER, Envelope
from application.errors import Crash, PermanentError, TransientError
from application.http_caller import collect_response
from application.outcome import Outcome
from application.ports import HttpResult
from application.processor import Processor
from application.settlement import Consumer
from domain.context import HttpResponse
from tests.support.counters.endpoints import BANK, Reported, Spend, Tally, Withdraw
from tests.support.counters.harness import Counters, counters, take, token_envelope

R1, R2 = uuid.UUID(int=101), uuid.UUID(int=102)
#: The counter that spends, and its account at the bank.
ACCOUNT = "c1"
SPEND_ID = uuid.UUID(int=201)


def _system(failpoints: str | None = None) -> Counters:
    return counters(failpoints)


def _open(system: Counters, balance: int = 500) -> None:
    system.open_account(ACCOUNT, balance)


def _body(amount: int, account: str = ACCOUNT) -> bytes:
    return encode(Withdraw(account, amount))


def _balance(system: Counters) -> int:
    return int(system.state("bank", ACCOUNT).balance)


def _bank_runs(system: Counters) -> int:
    return system.runs("bank")


def _bank_tr(system: Counters) -> Any:
    return system.store("bank").partitions[ACCOUNT].tr


def _tally(system: Counters) -> Tally:
    tally = system.state("counter", ACCOUNT)
    assert isinstance(tally, Tally)
    return tally


async def _spend(system: Counters, amount: int = 100) -> Envelope:
    """A `Spend` of `amount` for the counter, its token created (as its sender would)."""
    envelope = token_envelope(Spend(ACCOUNT, amount), SPEND_ID)
    await system.tokens.create("counter", [envelope])
    return envelope


async def _take(broker: MemoryBroker, queue: str, consumer: str = "test") -> MemoryDelivery:
    return await take(broker, queue, consumer, 1.0)


def _counter_worker(system: Counters, spec: str) -> Processor:
    """A counter worker with its own failpoints (crash raises `Crash`)."""
    return system.worker("counter", spec)


# --- callee: PUT ---------------------------------------------------------------------------


async def test_put_is_create_only() -> None:
    system = _system()
    callee = system.bank
    assert (await callee.put(R1, _body(10))).status == 201
    assert (await callee.put(R1, _body(10))).status == 200
    assert (await callee.put(R1, _body(99))).status == 409
    stored = await system.requests.get(R1)
    assert stored is not None
    assert stored.body == _body(10)  # the conflicting PUT changed nothing


async def test_late_put_after_delete_is_gone() -> None:
    system = _system()
    callee = system.bank
    assert (await callee.put(R1, _body(10))).status == 201
    assert (await callee.delete(R1)).status == 204
    assert (await callee.put(R1, _body(10))).status == 410
    assert R1 not in system.requests.requests
    assert (await callee.post(R1)).status == 404


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"{}",
        b'{"account": "c1"}',
        b'{"account": "c1", "amount": "lots"}',
    ],
)
async def test_put_of_an_invalid_body_is_422_and_stores_nothing(body: bytes) -> None:
    system = _system()
    answer = await system.bank.put(R1, body)
    assert answer.status == 422
    assert not answer.stored
    assert R1 not in system.requests.requests
    assert (await system.bank.put(R1, _body(10))).status == 201


async def test_delete_of_a_never_stored_id_leaves_a_tombstone() -> None:
    system = _system()
    assert (await system.bank.delete(R1)).status == 204
    assert R1 in system.requests.tombstones
    assert (await system.bank.put(R1, _body(10))).status == 410
    assert not system.requests.requests


async def test_delete_is_idempotent_and_removes_request_and_response() -> None:
    system = _system()
    _open(system)
    await system.bank.put(R1, _body(10))
    assert (await system.bank.post(R1)).status == 200
    assert R1 in system.store("bank").replies
    assert (await system.bank.delete(R1)).status == 204
    assert (await system.bank.delete(R1)).status == 204
    assert not system.requests.requests
    assert R1 not in system.store("bank").replies
    assert (await system.bank.get(R1)).status == 404
    assert (await system.bank.post(R1)).status == 404


async def test_tombstones_are_purged_after_the_retention_window_only() -> None:
    system = _system()
    await system.bank.delete(R1)
    retention = system.sweeper("bank").retention
    system.clock.advance(retention / 2)
    assert (await system.sweeper("bank").sweep()).purged_tombstones == 0
    assert (await system.bank.put(R1, _body(10))).status == 410
    system.clock.advance(retention)
    assert (await system.sweeper("bank").sweep()).purged_tombstones == 1
    assert R1 not in system.requests.tombstones


# --- callee: POST and GET ------------------------------------------------------------------


async def test_post_of_an_unknown_request_is_404_without_stored_header() -> None:
    system = _system()
    answer = await system.bank.post(R1)
    assert answer.status == 404
    assert not answer.stored
    assert _bank_runs(system) == 0


async def test_post_processes_once_and_answers_the_stored_response_on_every_retry() -> None:
    system = _system()
    _open(system, balance=500)
    await system.bank.put(R1, _body(120))
    before = await system.bank.get(R1)
    assert (before.status, before.stored) == (404, False)

    first = await system.bank.post(R1)
    assert (first.status, first.stored) == (200, True)
    assert dict(first.body) == {"debited": 120}
    assert _bank_runs(system) == 1
    assert _balance(system) == 380
    assert not await system.requests.exists(R1)  # answered: the consume step ran
    assert _bank_tr(system).message_id is None  # finished

    second = await system.bank.post(R1)
    assert second == first
    assert _bank_runs(system) == 1
    assert _balance(system) == 380
    assert await system.bank.get(R1) == first


async def test_five_concurrent_posts_execute_once_and_answer_identically() -> None:
    system = _system()
    _open(system, balance=500)
    await system.bank.put(R1, _body(64))
    answers = await asyncio.gather(*(system.bank.post(R1) for _ in range(5)))
    assert {(a.status, a.stored) for a in answers} == {(200, True)}
    assert all(a == answers[0] for a in answers)
    assert system.events.counts[("bank", "transaction.committed")] == 1
    # one process serialises its own deliveries of a partition: no needless conflicts
    assert system.events.counts[("bank", "transaction.conflict")] == 0
    assert _balance(system) == 436
    assert system.state("bank", ACCOUNT).debits == (64,)


async def test_concurrent_posts_on_two_callee_processes_execute_once() -> None:
    """Two callee instances share the stores but not their partition locks: only the
    transaction record's optimistic concurrency keeps the debit single."""
    system = _system()
    _open(system, balance=500)
    other = build_callee(BANK, system.system.ports("bank"), system.requests, "Withdraw")
    await system.bank.put(R1, _body(64))
    answers = await asyncio.gather(
        *(callee.post(R1) for callee in (system.bank, other, system.bank, other))
    )
    assert {(a.status, a.stored) for a in answers} == {(200, True)}
    assert all(a == answers[0] for a in answers)
    assert _balance(system) == 436
    assert system.state("bank", ACCOUNT).debits == (64,)
    assert _bank_tr(system).message_id is None


async def test_a_refusal_is_a_stored_409_that_never_changes() -> None:
    system = _system()
    _open(system, balance=100)
    await system.bank.put(R1, _body(128))
    refused = await system.bank.post(R1)
    assert (refused.status, refused.stored) == (409, True)
    assert refused.body["refused"] == "insufficient funds"

    # the balance changes through another request...
    await system.bank.put(R2, _body(32))
    assert (await system.bank.post(R2)).status == 200
    assert _balance(system) == 68
    # ... and then the account is topped up far beyond the refused amount
    _open(system, balance=10_000)
    runs = _bank_runs(system)

    for _ in range(3):
        assert await system.bank.post(R1) == refused
    assert await system.bank.get(R1) == refused
    assert _bank_runs(system) == runs
    assert _balance(system) == 10_000


async def test_a_request_the_handler_rejects_is_422_and_not_stored() -> None:
    system = _system()
    _open(system)
    # a negative amount makes the handler reject the request (a permanent error, not a
    # business answer): nothing is stored to answer later
    assert (await system.bank.put(R1, _body(-5))).status == 201
    answer = await system.bank.post(R1)
    assert (answer.status, answer.stored) == (422, False)
    assert (await system.bank.get(R1)).status == 404
    assert R1 not in system.store("bank").replies
    assert _balance(system) == 500


async def test_lost_reply_after_the_callee_commit_is_answered_identically_on_retry() -> None:
    system = _system("callee.after_commit=crash@1")
    _open(system, balance=500)
    await system.bank.put(R1, _body(70))
    with pytest.raises(Crash):
        await system.bank.post(R1)
    assert _bank_tr(system).message_id == R1  # committed, not finished
    retry = await system.bank.post(R1)
    assert (retry.status, retry.stored) == (200, True)
    assert dict(retry.body) == {"debited": 70}
    assert _bank_runs(system) == 1
    assert _balance(system) == 430
    assert await system.bank.post(R1) == retry


async def test_retry_after_the_callee_commit_finishes_the_transaction_before_answering() -> None:
    system = _system("callee.after_commit=crash@1")
    _open(system, balance=500)
    await system.bank.put(R1, _body(70))
    with pytest.raises(Crash):
        await system.bank.post(R1)
    retry = await system.bank.post(R1)
    assert retry.status == 200
    assert _bank_tr(system).message_id is None
    assert not await system.requests.exists(R1)


async def test_crash_before_the_reply_is_answered_identically_on_retry() -> None:
    system = _system("callee.before_reply=crash@1")
    _open(system, balance=500)
    await system.bank.put(R1, _body(70))
    with pytest.raises(Crash):
        await system.bank.post(R1)
    retry = await system.bank.post(R1)
    assert (retry.status, dict(retry.body)["debited"]) == (200, 70)
    assert _bank_runs(system) == 1
    assert _balance(system) == 430


async def test_a_transient_failure_on_the_callee_commits_nothing_and_answers_503() -> None:
    system = _system()
    _open(system, balance=500)
    store = system.store("bank")
    real_commit = store.commit

    async def unreachable(*args: Any, **kwargs: Any) -> None:
        store.commit = real_commit
        raise TransientError("connection lost before COMMIT")

    store.commit = unreachable
    await system.bank.put(R1, _body(70))
    failed = await system.bank.post(R1)
    assert (failed.status, failed.stored) == (503, False)
    assert failed.body == {"error": "temporarily unavailable: retry"}  # nothing of inside
    assert failed.internal == "connection lost before COMMIT"  # for the log
    assert (await system.bank.get(R1)).status == 404
    assert _balance(system) == 500
    assert await system.requests.exists(R1)
    retry = await system.bank.post(R1)
    assert (retry.status, retry.stored) == (200, True)
    assert _balance(system) == 430


# --- caller: classification of the callee's answers ----------------------------------------


class _Answering:
    def __init__(self, result: HttpResult) -> None:
        self.result = result

    async def put(self, url: str, body: bytes) -> None:
        raise AssertionError("not used")

    async def post(self, url: str) -> HttpResult:
        return self.result

    async def delete(self, url: str) -> None:
        raise AssertionError("not used")


@pytest.mark.parametrize(
    ("status", "stored", "expected"),
    [
        (200, True, HttpResponse(200, {"x": 1})),
        (409, True, HttpResponse(409, {"x": 1})),  # a refusal is a business answer
        (404, False, None),
        (404, True, HttpResponse(404, {"x": 1})),
    ],
)
async def test_collect_response_returns_stored_answers_whatever_their_status(
    status: int,
    stored: bool,
    expected: HttpResponse | None,
) -> None:
    http = _Answering(HttpResult(status, {"x": 1}, stored))
    assert await collect_response(http, "inproc://bank/requests/1", None) == expected


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (500, TransientError),
        (503, TransientError),
        (409, PermanentError),
        (400, PermanentError),
        (422, PermanentError),
    ],
)
async def test_collect_response_classifies_protocol_answers(
    status: int,
    error: type[Exception],
) -> None:
    http = _Answering(HttpResult(status, {"error": "x"}, False))
    with pytest.raises(error):
        await collect_response(http, "inproc://bank/requests/1", None)


async def test_a_callees_error_body_is_quoted_only_in_part() -> None:
    """A callee's body is its to choose: the dead-letter reason quotes a bounded prefix."""
    http = _Answering(HttpResult(400, {"error": "x" * 100_000}, False))
    with pytest.raises(PermanentError) as caught:
        await collect_response(http, "inproc://bank/requests/1", None)
    assert caught.value.reason.startswith("callee answered 400 for inproc://bank/requests/1: ")
    assert len(caught.value.reason) < 300


# --- caller: the follow-up, end to end -----------------------------------------------------


async def _audit(system: Counters) -> list[Envelope]:
    """Every message waiting in the audit's queue, taken and acked."""
    taken = []
    for _ in range(system.broker.depth("audit")):
        delivery = await _take(system.broker, "audit")
        await delivery.ack()
        taken.append(delivery.envelope)
    return taken


async def test_follow_up_debits_the_account_and_deletes_the_request_on_the_callee() -> None:
    system = _system()
    _open(system, balance=500)
    spend = await _spend(system)
    assert await system.processor("counter").process(spend) is Outcome.PROCESSED
    assert (_tally(system).spent, _tally(system).refused) == ((), ())  # awaiting the answer
    (request_id,) = system.requests.requests
    assert await system.requests.exists(request_id)  # stored, not yet answered

    follow_up = await _take(system.broker, "counter")
    assert follow_up.envelope.type == "Spent"
    assert follow_up.envelope.header(REQUEST_URL_HEADER) == f"inproc://bank/requests/{request_id}"
    assert await system.processor("counter").process(follow_up.envelope) is Outcome.PROCESSED
    await follow_up.ack()

    assert _tally(system).spent == (100,)
    assert _balance(system) == 400
    assert _bank_runs(system) == 1
    assert not system.requests.requests
    assert request_id in system.requests.tombstones
    assert not system.store("bank").replies
    (event,) = await _audit(system)
    reported = decode(Reported, event.body)
    assert (reported.counter, reported.amount, reported.status) == (ACCOUNT, 100, 200)
    assert not await system.tokens.exists("counter", follow_up.envelope.message_id)
    assert system.store("counter").record_count() == 0


async def test_a_refused_debit_is_recorded_and_still_deletes_the_request() -> None:
    system = _system()
    _open(system, balance=50)
    await system.processor("counter").process(await _spend(system, 100))
    follow_up = await _take(system.broker, "counter")
    assert await system.processor("counter").process(follow_up.envelope) is Outcome.PROCESSED
    assert (_tally(system).spent, _tally(system).refused) == ((), (100,))
    assert _balance(system) == 50
    (event,) = await _audit(system)
    assert decode(Reported, event.body).status == 409
    assert not system.requests.requests


async def test_follow_up_whose_request_is_unknown_is_permanent_while_its_token_exists() -> None:
    system = _system()
    _open(system)
    await system.processor("counter").process(await _spend(system))
    (request_id,) = system.requests.requests
    await system.bank.delete(request_id)  # e.g. removed by hand on the callee
    follow_up = await _take(system.broker, "counter")
    with pytest.raises(PermanentError, match="unknown on the callee"):
        await system.processor("counter").process(follow_up.envelope)
    await system.tokens.delete("counter", follow_up.envelope.message_id)
    assert await system.processor("counter").process(follow_up.envelope) is Outcome.DUPLICATE
    assert _bank_runs(system) == 0


async def test_crash_after_the_follow_up_commit_still_deletes_the_request_on_redelivery() -> None:
    system = _system()
    _open(system, balance=500)
    await system.processor("counter").process(await _spend(system))
    (request_id,) = system.requests.requests

    doomed = Consumer(_counter_worker(system, "after_commit=crash"))
    delivery = await _take(system.broker, "counter", "worker-1")
    with pytest.raises(Crash):
        await doomed.settle(delivery)
    assert _tally(system).spent == (100,)  # committed...
    assert request_id in system.requests.requests  # ...but the DELETE was not sent
    assert system.broker.depth("audit") == 0

    assert system.broker.drop_consumer("worker-1") == 1
    redelivered = await _take(system.broker, "counter", "worker-2")
    assert redelivered.envelope == delivery.envelope
    survivor = system.consumer("counter")
    assert await survivor.settle(redelivered) is Outcome.DUPLICATE
    assert not system.requests.requests
    assert request_id in system.requests.tombstones
    assert len(await _audit(system)) == 1
    assert _bank_runs(system) == 1
    assert system.store("counter").partitions[ACCOUNT].tr.message_id is None
    assert system.broker.depth("counter") == 0


async def test_crash_after_put_leaves_a_request_the_next_winner_deletes() -> None:
    system = _system()
    _open(system, balance=500)
    spend = await _spend(system)
    with pytest.raises(Crash):
        await _counter_worker(system, "after_put=crash").process(spend)
    abandoned = set(system.requests.requests)
    assert len(abandoned) == 1
    assert len(await system.blobs.keys("receipts")) == 1  # the loser's receipt
    assert system.broker.depth("counter") == 0  # the follow-up was never sent

    assert await system.processor("counter").process(spend) is Outcome.PROCESSED
    assert abandoned.isdisjoint(system.requests.requests)
    assert abandoned <= set(system.requests.tombstones)
    assert len(system.requests.requests) == 1  # the winner's
    (receipt,) = _tally(system).receipts
    assert await system.blobs.keys("receipts") == [receipt]  # the loser's receipt is gone

    follow_up = await _take(system.broker, "counter")
    assert await system.processor("counter").process(follow_up.envelope) is Outcome.PROCESSED
    assert not system.requests.requests
    assert _bank_runs(system) == 1
    assert _balance(system) == 400


@pytest.mark.parametrize(
    ("point", "outcome"),
    [
        ("after_post", Outcome.PROCESSED),
        ("before_delete", Outcome.DUPLICATE),
        ("after_delete", Outcome.DUPLICATE),
    ],
)
async def test_crash_around_the_follow_ups_post_and_delete_is_repaired_by_redelivery(
    point: str, outcome: Outcome
) -> None:
    system = _system()
    _open(system, balance=500)
    await system.processor("counter").process(await _spend(system))
    follow_up = await _take(system.broker, "counter")
    with pytest.raises(Crash):
        await _counter_worker(system, f"{point}=crash").process(follow_up.envelope)
    assert await system.processor("counter").process(follow_up.envelope) is outcome
    assert _tally(system).spent == (100,)
    assert _bank_runs(system) == 1
    assert _balance(system) == 400
    assert not system.requests.requests
    assert len(await _audit(system)) == 1
    assert not await system.tokens.exists("counter", follow_up.envelope.message_id)
