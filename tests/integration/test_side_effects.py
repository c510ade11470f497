"""The orders endpoint with its real side-effect adapters: invoices as S3 objects (moto
server), payments as a uvicorn-served callee reached through httpx. Orders store, tokens and
broker stay in memory. Protocol 3.2, 3.4, 5, 6 and 8 on real I/O: every case ends with the
order settled once and nothing left behind (I8)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest

from adapters.http.client import CalleeRefused, HttpxRequests, http_client_resource
from adapters.memory.broker import MemoryBroker
from adapters.memory.request_store import MemoryRequestStore
from adapters.memory.token_store import MemoryTokenStore
from adapters.s3.blob_store import S3BlobStore, ensure_bucket, s3_client_resource
from adapters.s3.moto_server import MotoServer
from adapters.system.clock import ManualClock, SeededIds
from application.consumer import Settlement
from application.envelope import REQUEST_URL_HEADER, Envelope
from application.errors import Crash, RequestDeleted
from application.failpoints import Failpoints
from application.observability import HANDLER_INVOKED, TRANSACTION_CONFLICT, CountingSink
from application.processor import Outcome, Processor, Strategy
from domain.sample import ORDERS
from domain.sample.orders import AWAITING_PAYMENT, CONFIRMED, REJECTED
from domain.sample.payments import open_account
from entrypoints.embedded import SampleSystem
from entrypoints.http_status import StatusServer
from entrypoints.payments_app import create_payments_app
from entrypoints.settings import Settings
from tests.support.orders_flow import CUSTOMER, ORDER, ready_order
from tests.support.orders_flow import take as _take
from tests.support.world import crash

REGION = "eu-west-1"
TOKEN, LIMIT = "side-effects-token", 4096
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """One moto S3 server for the module (server mode; each test makes its own bucket)."""
    server = MotoServer()
    try:
        yield server.start()
    finally:
        server.stop()


@dataclass
class Wired:
    """The sample system with S3 blobs and the payments callee served over HTTP."""

    system: SampleSystem
    base: str
    client: httpx.AsyncClient
    blobs: S3BlobStore
    http: HttpxRequests
    bucket: str

    def url(self, request_id: uuid.UUID | str) -> str:
        return f"{self.base}/requests/{request_id}"

    def runs(self, endpoint: str = "payments") -> int:
        events = self.system.events
        assert isinstance(events, CountingSink)
        return events.counts[(endpoint, HANDLER_INVOKED)]

    def count(self, endpoint: str, event: str) -> int:
        events = self.system.events
        assert isinstance(events, CountingSink)
        return events.counts[(endpoint, event)]

    def order(self) -> Any:
        return self.system.stores["orders"].partitions[str(ORDER)].state

    def balance(self) -> Decimal:
        return self.system.stores["payments"].partitions[str(CUSTOMER)].state.balance

    def orders_processor(self, spec: str | None = None, **ports: Any) -> Processor:
        """An orders worker with its own failpoints (`crash` raises `Crash`) and ports."""
        return Processor(ORDERS, replace(self.system.ports("orders"), **ports), Strategy.TOKEN,
                         Failpoints.from_spec(spec, crash))


@asynccontextmanager
async def wired(moto_endpoint: str, failpoints: str | None = None, balance: str = "500.00",
                limit: str = "0") -> AsyncIterator[Wired]:
    """A fresh bucket, uvicorn on a free port serving the payments callee, and the system."""
    async with s3_client_resource(moto_endpoint, REGION, "side-effects", "moto-secret") as s3:
        bucket = f"side-effects-{uuid.uuid4().hex[:12]}"
        await ensure_bucket(s3, bucket)
        blobs = S3BlobStore(s3, bucket)
        resource = http_client_resource(5.0)
        client = await anext(resource)
        http = HttpxRequests(client, TOKEN)
        system = SampleSystem(Settings(), ManualClock(), SeededIds(11), CountingSink(),
                              MemoryBroker(), MemoryTokenStore(), blobs, MemoryRequestStore(),
                              Failpoints.from_spec(failpoints, crash), http=http,
                              services={"payments": "http://127.0.0.1:1"})
        system.stores["payments"].seed_state(
            str(CUSTOMER), open_account(CUSTOMER, Decimal(balance), Decimal(limit)))
        server = StatusServer(create_payments_app(system.callee, TOKEN, LIMIT), "127.0.0.1", 0)
        server.start()
        try:
            while not server.server.started:
                assert server.task is not None
                assert not server.task.done(), "uvicorn did not start"
                await asyncio.sleep(0.01)
            port = server.server.servers[0].sockets[0].getsockname()[1]
            base = f"http://127.0.0.1:{port}"
            system.services["payments"] = base  # every orders worker's ports share this dict
            yield Wired(system, base, client, blobs, http, bucket)
        finally:
            await resource.aclose()
            await server.stop()


async def _ready_order(w: Wired, price: str = "100.00") -> Envelope:
    return await ready_order(w.system, price)


async def _submitted(w: Wired, price: str = "100.00") -> tuple[Envelope, uuid.UUID]:
    """Drive the order to AWAITING_PAYMENT; returns the follow-up (taken and acked from the
    broker) and the ID of the request stored on the callee."""
    submit = await _ready_order(w, price)
    assert await w.system.processor("orders").process(submit) is Outcome.PROCESSED
    assert w.order().status == AWAITING_PAYMENT
    (request_id,) = w.system.requests.requests
    follow_up = await _take(w.system.broker, "orders")
    await follow_up.ack()
    assert follow_up.envelope.type == "PaymentResult"
    assert follow_up.envelope.header(REQUEST_URL_HEADER) == w.url(request_id)
    return follow_up.envelope, request_id


async def _assert_settled(w: Wired, status: str, strays: tuple[str, ...] = ()) -> None:
    """The oracle every case ends with: settled once, one invoice, nothing else left behind;
    `strays` are objects only the deferred clean-up may remove (gone after the sweep)."""
    system = w.system
    order = w.order()
    assert order.status == status
    assert system.broker.depth("orders") == 0
    assert system.broker.depth("ledger") == 1  # confirmed or rejected exactly once
    event = (await _take(system.broker, "ledger")).envelope
    assert event.type == ("OrderConfirmed" if status == CONFIRMED else "OrderRejected")
    assert set(system.tokens.rows) == {event.message_id}  # only the ledger's token
    assert await w.blobs.keys() == sorted([order.invoice_key, *strays])
    assert not system.requests.requests  # tombstones are fine
    assert not system.stores["payments"].replies
    assert w.runs() == 1
    for name in ("orders", "payments"):
        store = system.stores[name]
        assert store.record_count() == 0, name
        assert all(p.tr.message_id is None for p in store.partitions.values()), name
    clock = system.clock
    assert isinstance(clock, ManualClock)
    clock.advance(timedelta(seconds=system.settings.cleanup_grace_s + 1))
    for name in ("orders", "payments"):
        report = await system.sweeper(name).sweep()
        assert (report.finished, report.taken_over) == (0, 0), name
        assert not system.stores[name].cleanups, name
    assert await w.blobs.keys() == [order.invoice_key]
    assert not system.requests.requests


# --- 1. crash after the PUT -----------------------------------------------------------------


async def test_crash_after_put_leaves_a_request_the_next_winner_deletes(
    moto_endpoint: str,
) -> None:
    async with wired(moto_endpoint) as w:
        submit = await _ready_order(w)
        with pytest.raises(Crash):
            await w.orders_processor("after_put=crash").process(submit)
        abandoned = set(w.system.requests.requests)
        assert len(abandoned) == 1  # PUT over HTTP, then the crash
        (orphan,) = await w.blobs.keys()  # its invoice was uploaded before the PUT
        assert w.system.broker.depth("orders") == 0  # no follow-up sent

        # redelivery: processed normally, the winner's finish cleans the loser's artifacts
        assert await w.system.processor("orders").process(submit) is Outcome.PROCESSED
        assert abandoned.isdisjoint(w.system.requests.requests)
        assert abandoned <= set(w.system.requests.tombstones)
        assert len(w.system.requests.requests) == 1  # the winner's
        assert await w.blobs.keys() == [w.order().invoice_key] != [orphan]

        follow_up = await _take(w.system.broker, "orders")
        assert await w.system.consumer("orders").settle(follow_up) is Settlement.PROCESSED
        assert w.balance() == Decimal("400.00")
        await _assert_settled(w, CONFIRMED)


# --- 2. lost reply after the callee's commit ------------------------------------------------


@pytest.mark.parametrize("point", ["callee.after_commit", "callee.before_reply"])
async def test_a_reply_lost_after_the_callee_commit_is_the_same_on_retry(
    moto_endpoint: str, point: str
) -> None:
    async with wired(moto_endpoint, f"{point}=raise@1") as w:
        submit = await _ready_order(w)
        assert await w.system.processor("orders").process(submit) is Outcome.PROCESSED
        consumer = w.system.consumer("orders")
        lost = await _take(w.system.broker, "orders")
        assert await consumer.settle(lost) is Settlement.RETRIED  # 503: delayed redelivery
        assert (w.runs(), w.balance()) == (1, Decimal("400.00"))  # committed before the loss
        assert w.order().status == AWAITING_PAYMENT
        retry = await _take(w.system.broker, "orders")
        assert retry.envelope.message_id == lost.envelope.message_id
        assert await consumer.settle(retry) is Settlement.PROCESSED
        assert (w.runs(), w.balance()) == (1, Decimal("400.00"))
        await _assert_settled(w, CONFIRMED)


# --- 3. concurrent POSTs --------------------------------------------------------------------


async def test_five_concurrent_posts_through_httpx_execute_once(moto_endpoint: str) -> None:
    async with wired(moto_endpoint) as w:
        follow_up, request_id = await _submitted(w)
        answers = await asyncio.gather(*(w.http.post(w.url(request_id)) for _ in range(5)))
        assert {(a.status, a.stored) for a in answers} == {(200, True)}
        assert all(a == answers[0] for a in answers)
        assert dict(answers[0].body) == {"status": "approved", "order_key": ORDER,
                                         "amount": "100.00"}
        assert (w.runs(), w.balance()) == (1, Decimal("400.00"))
        # the follow-up's own POST gets the same stored answer
        assert await w.system.processor("orders").process(follow_up) is Outcome.PROCESSED
        assert (w.runs(), w.balance()) == (1, Decimal("400.00"))
        await _assert_settled(w, CONFIRMED)


# --- 4. a refusal stays a refusal -----------------------------------------------------------


async def test_a_refusal_stays_the_same_on_every_retry(moto_endpoint: str) -> None:
    async with wired(moto_endpoint, balance="50.00", limit="10.00") as w:
        follow_up, request_id = await _submitted(w, price="100.00")
        # the caller dies right after the POST: the refusal is stored, its answer lost
        with pytest.raises(Crash):
            await w.orders_processor("after_post=crash").process(follow_up)
        assert w.order().status == AWAITING_PAYMENT
        # the account is topped up far beyond the amount: the stored refusal must not change
        store = w.system.stores["payments"]
        store.seed_state(str(CUSTOMER), open_account(CUSTOMER, Decimal("10000.00"), Decimal(0)))
        answers = [await w.http.post(w.url(request_id)) for _ in range(3)]
        assert {(a.status, a.stored) for a in answers} == {(409, True)}
        assert all(a == answers[0] for a in answers)
        assert answers[0].body["reason"] == "insufficient funds"
        assert await w.system.processor("orders").process(follow_up) is Outcome.PROCESSED
        assert (w.runs(), w.balance()) == (1, Decimal("10000.00"))
        await _assert_settled(w, REJECTED)


# --- 5. crash after the follow-up's commit --------------------------------------------------


async def test_crash_after_the_follow_up_commit_still_deletes_the_request(
    moto_endpoint: str,
) -> None:
    async with wired(moto_endpoint) as w:
        submit = await _ready_order(w)
        assert await w.system.processor("orders").process(submit) is Outcome.PROCESSED
        (request_id,) = w.system.requests.requests
        broker = w.system.broker
        delivery = await _take(broker, "orders", "worker-1")
        doomed = w.orders_processor("after_commit=crash")
        with pytest.raises(Crash):
            await doomed.process(delivery.envelope)
        assert w.order().status == CONFIRMED  # committed...
        assert request_id in w.system.requests.requests  # ...but the DELETE was not sent
        assert broker.depth("ledger") == 0
        orders_runs = w.runs("orders")

        assert broker.drop_consumer("worker-1") == 1
        redelivered = await _take(broker, "orders", "worker-2")
        assert redelivered.envelope == delivery.envelope
        assert await w.system.consumer("orders").settle(redelivered) is Settlement.DUPLICATE
        assert w.runs("orders") == orders_runs  # finished, not handled again
        assert request_id not in w.system.requests.requests  # DELETE sent over HTTP
        assert request_id in w.system.requests.tombstones
        await _assert_settled(w, CONFIRMED)


# --- 6. a late PUT after DELETE -------------------------------------------------------------


async def test_a_late_put_after_delete_is_410_through_httpx(moto_endpoint: str) -> None:
    async with wired(moto_endpoint) as w:
        follow_up, request_id = await _submitted(w)
        stored = await w.system.requests.get(request_id)
        assert stored is not None
        assert await w.system.processor("orders").process(follow_up) is Outcome.PROCESSED
        with pytest.raises(RequestDeleted, match="410"):  # a Conflict: that attempt lost
            await w.http.put(w.url(request_id), stored.body)  # the same body, once more
        assert not w.system.requests.requests  # not resurrected
        await _assert_settled(w, CONFIRMED)


class _PausedPut:
    """Wraps an `HttpRequests` or a `BlobStore`: the first `put` waits for `release`
    (after setting `started`); every call is logged as (method, key or URL)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.started, self.release = asyncio.Event(), asyncio.Event()
        self.log: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def put(self, key: str, *args: Any) -> None:
        self.log.append(("put", key))
        if not self.started.is_set():
            self.started.set()
            await self.release.wait()
        await self.inner.put(key, *args)

    async def delete(self, key: str) -> None:
        self.log.append(("delete", key))
        await self.inner.delete(key)


async def test_a_stalled_attempts_put_after_the_winners_clean_up_is_a_conflict(
    moto_endpoint: str,
) -> None:
    async with wired(moto_endpoint) as w:
        submit = await _ready_order(w)
        paused = _PausedPut(w.http)
        stalled = w.orders_processor(http=paused)
        task = asyncio.create_task(stalled.process(submit))
        await asyncio.wait_for(paused.started.wait(), 5.0)  # blob uploaded, request registered
        assert await w.system.processor("orders").process(submit) is Outcome.PROCESSED
        ((_, late_url),) = paused.log
        assert uuid.UUID(late_url.rsplit("/", 1)[1]) in w.system.requests.tombstones
        paused.release.set()
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
        assert not isinstance(outcome, CalleeRefused), outcome  # never a dead letter
        assert not any(url == late_url for url in map(w.url, w.system.requests.requests))
        follow_up = await _take(w.system.broker, "orders")
        assert await w.system.processor("orders").process(follow_up.envelope) is \
            Outcome.PROCESSED
        await _assert_settled(w, CONFIRMED)
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is Outcome.DUPLICATE


# --- 7. an attempt stalled between register and upload --------------------------------------


@pytest.mark.parametrize("crash_after_upload", [False, True], ids=["recheck", "crash"])
async def test_an_upload_after_the_winner_finished_leaves_no_object(
    moto_endpoint: str, crash_after_upload: bool
) -> None:
    async with wired(moto_endpoint) as w:
        submit = await _ready_order(w)
        paused = _PausedPut(w.blobs)
        spec = "after_create:blob=crash" if crash_after_upload else None
        a = w.orders_processor(spec, blobs=paused)
        task = asyncio.create_task(a.process(submit))
        await asyncio.wait_for(paused.started.wait(), 5.0)  # A registered its invoice
        # B: a normal worker, runs to the end (commit, finish, token consumed)
        assert await w.system.processor("orders").process(submit) is Outcome.PROCESSED
        assert not await w.system.tokens.exists(submit.message_id)
        ((_, a_key),) = paused.log
        b_key = w.order().invoice_key
        assert a_key != b_key
        assert await w.blobs.keys() == [b_key]  # B's clean-up deleted A's (absent) object
        assert w.count("orders", TRANSACTION_CONFLICT) == 0

        paused.release.set()
        strays: tuple[str, ...] = ()
        if crash_after_upload:
            with pytest.raises(Crash):
                await task
            assert paused.log == [("put", a_key)]
            assert await w.blobs.keys() == sorted([a_key, b_key])  # until the deferred clean-up
            strays = (a_key,)
        else:
            # A's re-check fails: it deletes its own object, raises Conflict, and the
            # conflict retry finds the token gone
            assert await task is Outcome.DUPLICATE
            assert paused.log == [("put", a_key), ("delete", a_key)]
            assert w.count("orders", TRANSACTION_CONFLICT) == 1
            assert await w.blobs.keys() == [b_key]
        follow_up = await _take(w.system.broker, "orders")
        assert await w.system.processor("orders").process(follow_up.envelope) is \
            Outcome.PROCESSED
        await _assert_settled(w, CONFIRMED, strays)


# --- 8. credential and size limit -----------------------------------------------------------


async def test_unauthenticated_and_oversized_requests_are_refused(moto_endpoint: str) -> None:
    async with wired(moto_endpoint) as w:
        request_id = uuid.uuid4()
        body = b'{"amount": "1.00", "customer_key": 7, "order_key": 1}'
        anonymous = await w.client.put(w.url(request_id), content=body)
        assert (anonymous.status_code, anonymous.headers["WWW-Authenticate"]) == (401, "Bearer")
        big = await w.client.put(w.url(request_id), content=body + b" " * LIMIT, headers=AUTH)
        assert big.status_code == 413
        assert not w.system.requests.requests
        assert (await w.client.put(w.url(request_id), content=body, headers=AUTH)
                ).status_code == 201
