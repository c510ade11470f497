"""HTTP request/response exactly once (protocol 6): the counters' `bank` callee and the
`counter` endpoint calling it (`Spend`, follow-up `Spent`).

The failure table's rows for the HTTP artifacts and the caller's and callee's failpoints
(protocol 3.4, 6, 10) are proven here, the caller's on both token paths (`PATHS`): the
sample's real-process failure table (tests/sample/chaos/test_failure_table.py) keeps one
callee crash and names, per row it left to memory, its twin here.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest

from adapters.memory.broker import MemoryBroker, MemoryDelivery
from application.assembly import build_callee
from application.codec import decode, encode
from application.envelope import REQUEST_URL_HEADER, Envelope
from application.errors import Crash, PermanentError, TransientError
from application.http_callee import CalleeResponse, HttpCallee
from application.http_caller import collect_response
from application.observability import ATTEMPT_ABANDONED, TRANSACTION_COMMITTED
from application.outcome import Outcome
from application.ports import HttpResult
from application.processor import Processor
from application.records import Kind
from application.settlement import Settler
from domain.context import HttpResponse
from tests.support.counters.endpoints import BANK, Reported, Spend, Tally, Withdraw
from tests.support.counters.harness import Counters, counters, take, token_envelope

R1, R2 = uuid.UUID(int=101), uuid.UUID(int=102)
#: The counter that spends, and its account at the bank.
ACCOUNT = "c1"
SPEND_ID = uuid.UUID(int=201)
#: the caller's token paths: tokens in a store of their own, or co-located (protocol 3.2)
PATHS = ["general", "colocated"]
#: the consumer's retry delays (seconds): a retried delivery comes back at once
FAST = (0.001,)


def _system(failpoints: str | None = None, path: str = "general") -> Counters:
    return counters(failpoints, colocated=path == "colocated")


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


async def _retried(broker: MemoryBroker, queue: str) -> MemoryDelivery:
    """The delayed retry of a delivery of `queue` (one must be pending), when it is back."""
    assert broker.pending()["delayed retries"] == 1, broker.pending()
    deliveries = broker.consume(queue, "test")
    try:
        return await anext(deliveries)
    finally:
        await deliveries.aclose()


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
    # the attempt's end is said with the request's ID (eo chaos --production found a callee
    # attempt that a database restart ended with no event naming its message)
    assert system.events.counts[("bank", ATTEMPT_ABANDONED)] == 1
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

    doomed = Settler(_counter_worker(system, "after_commit=crash"))
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


def _request_of(system: Counters) -> uuid.UUID:
    """The ID of the one request the counter's partition has a record of (a URL
    `inproc://bank/requests/<id>`)."""
    [record] = [r for r in system.store("counter").partitions[ACCOUNT].records
                if r.kind is Kind.HTTP_REQUEST]
    return uuid.UUID(record.key.rpartition("/")[2])


async def _nothing_left(system: Counters) -> None:
    """What is at rest once the counter's messages are consumed: no request on the bank, no
    record, committed transaction or token of the counter's; once every grace period has
    passed and the sweepers ran, no deferred clean-up either."""
    assert not system.requests.requests
    assert not [m for m, endpoint in system.tokens.addresses.items() if endpoint == "counter"]
    for name in ("counter", "bank"):
        store = system.store(name)
        assert store.record_count() == 0, name
        assert not any(p.tr.is_committed for p in store.partitions.values()), name
    system.clock.advance(timedelta(hours=2))
    for name in ("counter", "bank"):
        await system.sweeper(name).sweep()
        assert not system.store(name).cleanups, name


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("point", ["after_put", "after_create:http_request"])
async def test_crash_after_put_leaves_a_request_the_next_winner_deletes(
    point: str, path: str
) -> None:
    """Row "create" for the HTTP request (caller `after_put`, `after_create:http_request`):
    the request is stored on the bank, the attempt dies before its re-check. Left: a
    request of a losing attempt on the callee; repaired by the next winner's clean-up,
    which DELETEs it (a tombstone) before any sweep: the handler ran twice, once committed,
    and the bank debited once."""
    system = _system(path=path)
    _open(system, balance=500)
    spend = await _spend(system)
    with pytest.raises(Crash):
        await _counter_worker(system, f"{point}=crash").process(spend)
    abandoned = set(system.requests.requests)
    assert len(abandoned) == 1
    assert len(await system.blobs.keys("receipts")) == 1  # the loser's receipt
    assert system.broker.depth("counter") == 0  # the follow-up was never sent

    assert await system.processor("counter").process(spend) is Outcome.PROCESSED
    assert system.runs("counter") == 2
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
    await _nothing_left(system)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("point", "stored"), [("after_register:http_request", False),
                                               ("before_commit", True)])
async def test_a_crash_before_the_request_or_the_commit_leaves_a_record_the_winner_cleans(
    point: str, stored: bool, path: str
) -> None:
    """Row "register" for the HTTP request (`after_register:http_request`: a record, no
    request on the bank) and a crash just before the commit (`before_commit`: the request
    stored, re-checked, never committed). Left: the attempt's records (and request);
    repaired by the next winner's clean-up, whose DELETE leaves a tombstone either way (for
    a request never stored too: a no-op delete a late PUT cannot undo), before any sweep:
    the handler ran twice, once committed, and the bank debited once."""
    system = _system(path=path)
    _open(system, balance=500)
    spend = await _spend(system)
    with pytest.raises(Crash):
        await _counter_worker(system, f"{point}=crash").process(spend)
    loser = _request_of(system)
    assert (loser in system.requests.requests) is stored
    assert system.broker.depth("counter") == 0  # the follow-up was never sent

    assert await system.processor("counter").process(spend) is Outcome.PROCESSED
    assert system.runs("counter") == 2
    assert loser not in system.requests.requests
    assert loser in system.requests.tombstones
    (receipt,) = _tally(system).receipts
    assert await system.blobs.keys("receipts") == [receipt]

    follow_up = await _take(system.broker, "counter")
    assert await system.processor("counter").process(follow_up.envelope) is Outcome.PROCESSED
    await follow_up.ack()
    assert (_bank_runs(system), _balance(system)) == (1, 400)
    assert _tally(system).spent == (100,)
    await _nothing_left(system)


@pytest.mark.parametrize("path", PATHS)
async def test_a_commit_rejected_by_an_error_is_retried_and_the_winner_deletes_its_request(
    path: str,
) -> None:
    """Row "commit rejected (error)" for the HTTP request: the Spend's attempt stored its
    request and receipt, and its commit failed (`before_commit=raise`: a transient error).
    The consumer retries the delivery; the retry's winning finish DELETEs the failed
    attempt's request and receipt before any sweep: the message retried once, the handler
    ran twice, once committed, and the bank debited once."""
    system = _system(path=path)
    _open(system, balance=500)
    spend = await _spend(system)
    await system.broker.dispatch("counter", spend)
    consumer = Settler(_counter_worker(system, "before_commit=raise@1"), retry_delays=FAST)
    assert await consumer.settle(await _take(system.broker, "counter")) is Outcome.RETRIED
    (loser,) = system.requests.requests
    retried = await _retried(system.broker, "counter")
    assert (retried.envelope.message_id, retried.attempt) == (spend.message_id, 2)
    assert await consumer.settle(retried) is Outcome.PROCESSED
    assert system.runs("counter") == 2
    assert loser not in system.requests.requests
    assert loser in system.requests.tombstones
    (receipt,) = _tally(system).receipts
    assert await system.blobs.keys("receipts") == [receipt]

    assert await consumer.settle(await _take(system.broker, "counter")) is Outcome.PROCESSED
    assert consumer.counts == {Outcome.RETRIED: 1, Outcome.PROCESSED: 2}
    assert (_bank_runs(system), _balance(system)) == (1, 400)
    assert len(await _audit(system)) == 1
    assert system.broker.idle()
    await _nothing_left(system)


class _ConnectionLost:
    """The bank as its caller sees it over a network: a callee process that dies while it
    answers a POST (`Crash`) is a connection lost to the caller, a transient error."""

    def __init__(self, callee: HttpCallee) -> None:
        self.callee = callee

    def __getattr__(self, name: str) -> Any:
        return getattr(self.callee, name)

    async def post(self, request_id: uuid.UUID) -> CalleeResponse:
        try:
            return await self.callee.post(request_id)
        except Crash:
            raise TransientError("connection lost: the callee died") from None


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("point", ["callee.after_commit", "callee.before_reply"])
async def test_a_callee_that_dies_answering_the_post_is_asked_again_and_debits_once(
    point: str, path: str
) -> None:
    """Callee `callee.after_commit` / `callee.before_reply` seen from the caller: the bank
    committed the debit (and, before the reply, finished it), then its process died, so
    the follow-up's POST fails as a lost connection does and the consumer retries the
    follow-up; the bank restarts, and the retried POST finishes the committed transaction
    (or finds it answered) and gets the stored response. Asserted: the bank's handler ran
    once and committed once; the follow-up was retried once and its handler ran once."""
    system = _system(f"{point}=crash@1", path=path)
    _open(system, balance=500)
    await system.processor("counter").process(await _spend(system))
    (request_id,) = system.requests.requests
    callees = system.system.callees
    callees["bank"] = _ConnectionLost(system.bank)  # type: ignore[assignment]
    consumer = Settler(system.processor("counter"), retry_delays=FAST)
    assert await consumer.settle(await _take(system.broker, "counter")) is Outcome.RETRIED
    assert (_bank_runs(system), _balance(system)) == (1, 400)  # committed before it died
    # the restarted bank process (no failpoint), on the same stores
    callees["bank"] = build_callee(BANK, system.system.ports("bank"), system.requests,
                                   "Withdraw")
    assert await consumer.settle(await _retried(system.broker, "counter")) is Outcome.PROCESSED
    assert consumer.counts == {Outcome.RETRIED: 1, Outcome.PROCESSED: 1}
    assert _tally(system).spent == (100,)
    assert system.runs("counter") == 2  # the Spend's, the follow-up's
    assert (_bank_runs(system), _balance(system)) == (1, 400)
    assert system.events.counts[("bank", TRANSACTION_COMMITTED)] == 1
    assert request_id in system.requests.tombstones
    assert len(await _audit(system)) == 1
    await _nothing_left(system)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("point", "outcome"),
    [
        ("after_post", Outcome.PROCESSED),
        ("before_delete", Outcome.DUPLICATE),
        ("after_delete", Outcome.DUPLICATE),
    ],
)
async def test_crash_around_the_follow_ups_post_and_delete_is_repaired_by_redelivery(
    point: str, outcome: Outcome, path: str
) -> None:
    """Caller `after_post` (the bank answered, the caller died before its handler: the
    redelivered follow-up's POST gets the stored response) and `before_delete` /
    `after_delete` (the follow-up committed, its finish died around the DELETE, its first
    publication: the redelivery finishes it, DELETE again, idempotent). Asserted: the bank
    debited once, the follow-up's handler ran once, the request deleted (tombstone), one
    report, nothing at rest."""
    system = _system(path=path)
    _open(system, balance=500)
    await system.processor("counter").process(await _spend(system))
    (request_id,) = system.requests.requests
    follow_up = await _take(system.broker, "counter")
    with pytest.raises(Crash):
        await _counter_worker(system, f"{point}=crash").process(follow_up.envelope)
    assert await system.processor("counter").process(follow_up.envelope) is outcome
    await follow_up.ack()
    assert _tally(system).spent == (100,)
    assert system.runs("counter") == 2  # the Spend's, the follow-up's: once each
    assert _bank_runs(system) == 1
    assert _balance(system) == 400
    assert not system.requests.requests
    assert request_id in system.requests.tombstones
    assert len(await _audit(system)) == 1
    assert not await system.tokens.exists("counter", follow_up.envelope.message_id)
    await _nothing_left(system)
