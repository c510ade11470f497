"""HTTP request/response exactly once (protocol 6): the payments callee and the orders caller."""

from __future__ import annotations

import asyncio
import uuid
from decimal import Decimal
from typing import Any

import pytest

from adapters.memory.blob_store import MemoryBlobStore
from adapters.memory.broker import MemoryBroker, MemoryDelivery
from adapters.memory.request_store import MemoryRequestStore
from adapters.memory.token_store import MemoryTokenStore
from adapters.system.clock import ManualClock, SeededIds
from application.codec import decode, encode
from application.consumer import Consumer, Settlement
from application.envelope import REQUEST_URL_HEADER, Envelope
from application.errors import Crash, PermanentError, TransientError
from application.failpoints import Failpoints
from application.http_callee import HttpCallee
from application.http_caller import collect_response
from application.observability import HANDLER_INVOKED, CountingSink
from application.ports import HttpResult
from application.processor import Outcome, Ports, Processor, Strategy
from domain.context import HttpResponse
from domain.sample import ORDERS, PAYMENTS
from domain.sample.messages import (
    OrderConfirmed,
    OrderRejected,
    PaymentRequest,
)
from domain.sample.orders import AWAITING_PAYMENT, CONFIRMED, REJECTED
from domain.sample.payments import open_account
from entrypoints.embedded import PAYMENT_REQUEST, SampleSystem
from entrypoints.settings import Settings
from tests.support.orders_flow import CUSTOMER, ORDER, take
from tests.support.orders_flow import ready_order as _ready_order_of
from tests.support.world import crash

R1, R2 = uuid.UUID(int=101), uuid.UUID(int=102)


def _system(failpoints: str | None = None) -> SampleSystem:
    return SampleSystem(
        Settings(),
        ManualClock(),
        SeededIds(11),
        CountingSink(),
        MemoryBroker(),
        MemoryTokenStore(),
        MemoryBlobStore(),
        MemoryRequestStore(),
        Failpoints.from_spec(failpoints, crash),
    )


def _open(system: SampleSystem, balance: str = "500.00", limit: str = "0") -> None:
    system.stores["payments"].seed_state(
        str(CUSTOMER), open_account(CUSTOMER, Decimal(balance), Decimal(limit))
    )


def _body(amount: str, order: int = ORDER) -> bytes:
    return encode(PaymentRequest(order, CUSTOMER, Decimal(amount)))


def _balance(system: SampleSystem) -> Decimal:
    return system.stores["payments"].partitions[str(CUSTOMER)].state.balance


def _payments_runs(system: SampleSystem) -> int:
    events = system.events
    assert isinstance(events, CountingSink)
    return events.counts[("payments", HANDLER_INVOKED)]


def _payments_tr(system: SampleSystem) -> Any:
    return system.stores["payments"].partitions[str(CUSTOMER)].tr


def _order(system: SampleSystem) -> Any:
    return system.stores["orders"].partitions[str(ORDER)].state


async def _ready_order(system: SampleSystem, price: str = "100.00") -> Envelope:
    return await _ready_order_of(system, price)


async def _take(broker: MemoryBroker, queue: str, consumer: str = "test") -> MemoryDelivery:
    return await take(broker, queue, consumer, 1.0)


def _orders_processor(system: SampleSystem, spec: str) -> Processor:
    """An orders worker with its own failpoints (crash raises `Crash`)."""
    return Processor(ORDERS, system.ports("orders"), Strategy.TOKEN,
                     Failpoints.from_spec(spec, crash))


# --- callee: PUT ---------------------------------------------------------------------------


async def test_put_is_create_only() -> None:
    system = _system()
    callee = system.callee
    assert (await callee.put(R1, _body("10.00"))).status == 201
    assert (await callee.put(R1, _body("10.00"))).status == 200
    assert (await callee.put(R1, _body("99.00"))).status == 409
    stored = await system.requests.get(R1)
    assert stored is not None
    assert stored.body == _body("10.00")  # the conflicting PUT changed nothing


async def test_late_put_after_delete_is_gone() -> None:
    system = _system()
    callee = system.callee
    assert (await callee.put(R1, _body("10.00"))).status == 201
    assert (await callee.delete(R1)).status == 204
    assert (await callee.put(R1, _body("10.00"))).status == 410
    assert R1 not in system.requests.requests
    assert (await callee.post(R1)).status == 404


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"{}",
        b'{"order_key": 1, "customer_key": 7}',
        b'{"order_key": 1, "customer_key": 7, "amount": "lots"}',
    ],
)
async def test_put_of_an_invalid_body_is_422_and_stores_nothing(body: bytes) -> None:
    system = _system()
    answer = await system.callee.put(R1, body)
    assert answer.status == 422
    assert not answer.stored
    assert R1 not in system.requests.requests
    assert (await system.callee.put(R1, _body("10.00"))).status == 201


async def test_delete_of_a_never_stored_id_leaves_a_tombstone() -> None:
    system = _system()
    assert (await system.callee.delete(R1)).status == 204
    assert R1 in system.requests.tombstones
    assert (await system.callee.put(R1, _body("10.00"))).status == 410
    assert not system.requests.requests


async def test_delete_is_idempotent_and_removes_request_and_response() -> None:
    system = _system()
    _open(system)
    await system.callee.put(R1, _body("10.00"))
    assert (await system.callee.post(R1)).status == 200
    assert (await system.callee.delete(R1)).status == 204
    assert (await system.callee.delete(R1)).status == 204
    assert not system.requests.requests
    assert R1 not in system.stores["payments"].replies
    assert (await system.callee.get(R1)).status == 404
    assert (await system.callee.post(R1)).status == 404


async def test_tombstones_are_purged_after_the_retention_window_only() -> None:
    system = _system()
    assert isinstance(system.clock, ManualClock)
    await system.callee.delete(R1)
    system.clock.current += system.sweeper("payments").retention / 2
    assert (await system.sweeper("payments").sweep()).purged_tombstones == 0
    assert (await system.callee.put(R1, _body("10.00"))).status == 410
    system.clock.current += system.sweeper("payments").retention
    assert (await system.sweeper("payments").sweep()).purged_tombstones == 1
    assert R1 not in system.requests.tombstones


# --- callee: POST and GET ------------------------------------------------------------------


async def test_post_of_an_unknown_request_is_404_without_stored_header() -> None:
    system = _system()
    answer = await system.callee.post(R1)
    assert answer.status == 404
    assert not answer.stored
    assert _payments_runs(system) == 0


async def test_post_processes_once_and_answers_the_stored_response_on_every_retry() -> None:
    system = _system()
    _open(system, balance="500.00")
    await system.callee.put(R1, _body("120.00"))
    before = await system.callee.get(R1)
    assert (before.status, before.stored) == (404, False)

    first = await system.callee.post(R1)
    assert (first.status, first.stored) == (200, True)
    assert dict(first.body) == {"status": "approved", "order_key": ORDER, "amount": "120.00"}
    assert _payments_runs(system) == 1
    assert _balance(system) == Decimal("380.00")
    assert not await system.requests.exists(R1)  # answered: the consume step ran
    assert _payments_tr(system).message_id is None  # finished

    second = await system.callee.post(R1)
    assert second == first
    assert _payments_runs(system) == 1
    assert _balance(system) == Decimal("380.00")
    assert await system.callee.get(R1) == first


async def test_five_concurrent_posts_execute_once_and_answer_identically() -> None:
    system = _system()
    _open(system, balance="500.00")
    await system.callee.put(R1, _body("50.00"))
    answers = await asyncio.gather(*(system.callee.post(R1) for _ in range(5)))
    assert {(a.status, a.stored) for a in answers} == {(200, True)}
    assert all(a == answers[0] for a in answers)
    events = system.events
    assert isinstance(events, CountingSink)
    assert events.counts[("payments", "transaction.committed")] == 1
    # one process serialises its own deliveries of a partition: no needless conflicts
    assert events.counts[("payments", "transaction.conflict")] == 0
    assert _balance(system) == Decimal("450.00")
    assert system.stores["payments"].partitions[str(CUSTOMER)].state.paid == (ORDER,)


async def test_concurrent_posts_on_two_callee_processes_execute_once() -> None:
    """Two callee instances share the stores but not their partition locks: only the
    transaction record's optimistic concurrency keeps the debit single."""
    system = _system()
    _open(system, balance="500.00")
    ports = Ports(
        tokens=system.requests,
        store=system.stores["payments"],
        dispatcher=system.broker,
        clock=system.clock,
        ids=system.ids,
        events=system.events,
    )
    other = HttpCallee(Processor(PAYMENTS, ports), system.requests, PAYMENT_REQUEST)
    await system.callee.put(R1, _body("50.00"))
    answers = await asyncio.gather(
        *(callee.post(R1) for callee in (system.callee, other, system.callee, other))
    )
    assert {(a.status, a.stored) for a in answers} == {(200, True)}
    assert all(a == answers[0] for a in answers)
    assert _balance(system) == Decimal("450.00")
    assert _payments_tr(system).message_id is None


async def test_a_refusal_is_a_stored_409_that_never_changes() -> None:
    system = _system()
    _open(system, balance="100.00", limit="0")
    await system.callee.put(R1, _body("150.00", order=1))
    refused = await system.callee.post(R1)
    assert (refused.status, refused.stored) == (409, True)
    assert refused.body["reason"] == "insufficient funds"

    # the balance changes through another request...
    await system.callee.put(R2, _body("30.00", order=2))
    assert (await system.callee.post(R2)).status == 200
    assert _balance(system) == Decimal("70.00")
    # ... and then the account is topped up far beyond the refused amount
    account = system.stores["payments"].partitions[str(CUSTOMER)].state
    system.stores["payments"].seed_state(
        str(CUSTOMER), open_account(CUSTOMER, Decimal("10000.00"), account.credit_limit)
    )
    runs = _payments_runs(system)

    for _ in range(3):
        assert await system.callee.post(R1) == refused
    assert await system.callee.get(R1) == refused
    assert _payments_runs(system) == runs
    assert _balance(system) == Decimal("10000.00")


async def test_post_for_another_customers_account_is_rejected_422_and_not_stored() -> None:
    system = _system()
    _open(system)
    # the partition is the request's customer; an account stored under it for another
    # customer makes the handler reject the request (a permanent error, not a business answer)
    system.stores["payments"].seed_state("8", open_account(CUSTOMER, Decimal(1), Decimal(0)))
    await system.callee.put(R1, encode(PaymentRequest(ORDER, 8, Decimal("1.00"))))
    answer = await system.callee.post(R1)
    assert (answer.status, answer.stored) == (422, False)
    assert (await system.callee.get(R1)).status == 404


async def test_lost_reply_after_the_callee_commit_is_answered_identically_on_retry() -> None:
    system = _system("callee.after_commit=crash@1")
    _open(system, balance="500.00")
    await system.callee.put(R1, _body("70.00"))
    with pytest.raises(Crash):
        await system.callee.post(R1)
    assert _payments_tr(system).message_id == R1  # committed, not finished
    retry = await system.callee.post(R1)
    assert (retry.status, retry.stored) == (200, True)
    assert dict(retry.body) == {"status": "approved", "order_key": ORDER, "amount": "70.00"}
    assert _payments_runs(system) == 1
    assert _balance(system) == Decimal("430.00")
    assert await system.callee.post(R1) == retry


async def test_retry_after_the_callee_commit_finishes_the_transaction_before_answering() -> None:
    system = _system("callee.after_commit=crash@1")
    _open(system, balance="500.00")
    await system.callee.put(R1, _body("70.00"))
    with pytest.raises(Crash):
        await system.callee.post(R1)
    retry = await system.callee.post(R1)
    assert retry.status == 200
    assert _payments_tr(system).message_id is None
    assert not await system.requests.exists(R1)


async def test_crash_before_the_reply_is_answered_identically_on_retry() -> None:
    system = _system("callee.before_reply=crash@1")
    _open(system, balance="500.00")
    await system.callee.put(R1, _body("70.00"))
    with pytest.raises(Crash):
        await system.callee.post(R1)
    retry = await system.callee.post(R1)
    assert (retry.status, dict(retry.body)["amount"]) == (200, "70.00")
    assert _payments_runs(system) == 1
    assert _balance(system) == Decimal("430.00")


async def test_a_transient_failure_on_the_callee_commits_nothing_and_answers_503() -> None:
    system = _system()
    _open(system, balance="500.00")
    store = system.stores["payments"]
    real_commit = store.commit

    async def unreachable(*args: Any, **kwargs: Any) -> None:
        store.commit = real_commit  # type: ignore[method-assign]
        raise TransientError("connection lost before COMMIT")

    store.commit = unreachable  # type: ignore[method-assign]
    await system.callee.put(R1, _body("70.00"))
    failed = await system.callee.post(R1)
    assert (failed.status, failed.stored) == (503, False)
    assert (await system.callee.get(R1)).status == 404
    assert _balance(system) == Decimal("500.00")
    assert await system.requests.exists(R1)
    retry = await system.callee.post(R1)
    assert (retry.status, retry.stored) == (200, True)
    assert _balance(system) == Decimal("430.00")


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
    assert await collect_response(http, "inproc://payments/requests/1", None) == expected


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
        await collect_response(http, "inproc://payments/requests/1", None)


# --- caller: the follow-up, end to end -----------------------------------------------------


async def _ledger(system: SampleSystem) -> list[Envelope]:
    """Every message waiting in the ledger's queue, taken and acked."""
    taken = []
    for _ in range(system.broker.depth("ledger")):
        delivery = await _take(system.broker, "ledger")
        await delivery.ack()
        taken.append(delivery.envelope)
    return taken


async def test_follow_up_pays_the_order_and_deletes_the_request_on_the_callee() -> None:
    system = _system()
    _open(system, balance="500.00")
    submit = await _ready_order(system)
    assert await system.processor("orders").process(submit) is Outcome.PROCESSED
    assert _order(system).status == AWAITING_PAYMENT
    (request_id,) = system.requests.requests
    assert await system.requests.exists(request_id)  # stored, not yet answered

    follow_up = await _take(system.broker, "orders")
    assert follow_up.envelope.type == "PaymentResult"
    assert (
        follow_up.envelope.header(REQUEST_URL_HEADER) == f"inproc://payments/requests/{request_id}"
    )
    assert await system.processor("orders").process(follow_up.envelope) is Outcome.PROCESSED
    await follow_up.ack()

    assert _order(system).status == CONFIRMED
    assert _balance(system) == Decimal("400.00")
    assert _payments_runs(system) == 1
    assert not system.requests.requests
    assert request_id in system.requests.tombstones
    assert not system.stores["payments"].replies
    (event,) = await _ledger(system)
    confirmed = decode(OrderConfirmed, event.body)
    assert (confirmed.order_key, confirmed.total) == (ORDER, Decimal("100.00"))
    assert not await system.tokens.exists(follow_up.envelope.message_id)
    assert system.stores["orders"].record_count() == 0


async def test_a_refused_payment_rejects_the_order_and_still_deletes_the_request() -> None:
    system = _system()
    _open(system, balance="50.00", limit="0")
    submit = await _ready_order(system, price="100.00")
    await system.processor("orders").process(submit)
    follow_up = await _take(system.broker, "orders")
    assert await system.processor("orders").process(follow_up.envelope) is Outcome.PROCESSED
    assert _order(system).status == REJECTED
    assert _balance(system) == Decimal("50.00")
    (event,) = await _ledger(system)
    assert decode(OrderRejected, event.body).reason == "insufficient funds"
    assert not system.requests.requests


async def test_follow_up_whose_request_is_unknown_is_permanent_while_its_token_exists() -> None:
    system = _system()
    _open(system)
    submit = await _ready_order(system)
    await system.processor("orders").process(submit)
    (request_id,) = system.requests.requests
    await system.callee.delete(request_id)  # e.g. removed by hand on the callee
    follow_up = await _take(system.broker, "orders")
    with pytest.raises(PermanentError, match="unknown on the callee"):
        await system.processor("orders").process(follow_up.envelope)
    await system.tokens.delete(follow_up.envelope.message_id)
    assert await system.processor("orders").process(follow_up.envelope) is Outcome.DUPLICATE
    assert _payments_runs(system) == 0


async def test_crash_after_the_follow_up_commit_still_deletes_the_request_on_redelivery() -> None:
    system = _system()
    _open(system, balance="500.00")
    submit = await _ready_order(system)
    await system.processor("orders").process(submit)
    (request_id,) = system.requests.requests

    doomed = Consumer(_orders_processor(system, "after_commit=crash"))
    delivery = await _take(system.broker, "orders", "worker-1")
    with pytest.raises(Crash):
        await doomed.settle(delivery)
    assert _order(system).status == CONFIRMED  # committed...
    assert request_id in system.requests.requests  # ...but the DELETE was not sent
    assert system.broker.depth("ledger") == 0

    assert system.broker.drop_consumer("worker-1") == 1
    redelivered = await _take(system.broker, "orders", "worker-2")
    assert redelivered.envelope == delivery.envelope
    survivor = system.consumer("orders")
    assert await survivor.settle(redelivered) is Settlement.DUPLICATE
    assert not system.requests.requests
    assert request_id in system.requests.tombstones
    assert len(await _ledger(system)) == 1
    assert _payments_runs(system) == 1
    assert system.stores["orders"].partitions[str(ORDER)].tr.message_id is None
    assert system.broker.depth("orders") == 0


async def test_crash_after_put_leaves_a_request_the_next_winner_deletes() -> None:
    system = _system()
    _open(system, balance="500.00")
    submit = await _ready_order(system)
    with pytest.raises(Crash):
        await _orders_processor(system, "after_put=crash").process(submit)
    abandoned = set(system.requests.requests)
    assert len(abandoned) == 1
    assert system.broker.depth("orders") == 0  # the follow-up was never sent

    assert await system.processor("orders").process(submit) is Outcome.PROCESSED
    assert abandoned.isdisjoint(system.requests.requests)
    assert abandoned <= set(system.requests.tombstones)
    assert len(system.requests.requests) == 1  # the winner's
    invoice = _order(system).invoice_key
    assert await system.blobs.keys("invoices") == [invoice]  # the loser's invoice is gone

    follow_up = await _take(system.broker, "orders")
    assert await system.processor("orders").process(follow_up.envelope) is Outcome.PROCESSED
    assert not system.requests.requests
    assert _payments_runs(system) == 1
    assert _balance(system) == Decimal("400.00")


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
    _open(system, balance="500.00")
    await system.processor("orders").process(await _ready_order(system))
    follow_up = await _take(system.broker, "orders")
    with pytest.raises(Crash):
        await _orders_processor(system, f"{point}=crash").process(follow_up.envelope)
    assert await system.processor("orders").process(follow_up.envelope) is outcome
    assert _order(system).status == CONFIRMED
    assert _payments_runs(system) == 1
    assert _balance(system) == Decimal("400.00")
    assert not system.requests.requests
    assert len(await _ledger(system)) == 1
    assert not await system.tokens.exists(follow_up.envelope.message_id)
