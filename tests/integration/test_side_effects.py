"""The counters' `counter` endpoint with its real side-effect adapters: receipts as S3 objects
(moto server), the `bank` callee served by uvicorn and reached through httpx.

The stores, tokens and broker stay in memory. Protocol 3.2, 3.4, 5, 6 and 8 on real I/O: a
`Spend` writes a receipt blob and asks the bank to debit it; every case ends with the spend
settled once (debited or refused once, reported to `audit` once) and nothing left behind (I8).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import httpx
import pytest

from adapters.http.client import CalleeRefused, HttpxRequests, http_client_resource
from adapters.memory.broker import MemoryBroker
from adapters.memory.http import InProcessHttp
from adapters.memory.request_store import MemoryRequestStore
from adapters.memory.token_store import MemoryTokenStore
from adapters.memory.transactional_store import MemoryTransactionalStore
from adapters.s3.blob_store import S3BlobStore, ensure_bucket, s3_client_resource
from adapters.s3.moto_server import MotoServer
from adapters.system.clock import ManualClock, SeededIds
from application.assembly import build_processor
from application.codec import decode
from application.envelope import REQUEST_URL_HEADER, Envelope
from application.errors import Crash, RequestDeleted
from application.failpoints import Failpoints
from application.http_callee import HttpCallee
from application.observability import HANDLER_INVOKED, TRANSACTION_CONFLICT, CountingSink
from application.outcome import Outcome
from application.processor import Processor
from application.strategy import Strategy
from application.workers import Workers
from entrypoints.callee_app import create_callee_app
from entrypoints.composition import tunables_of, workers_of
from entrypoints.embedded import memory_adapters
from entrypoints.settings import load_settings, resolve_service
from entrypoints.status import StatusServer, listening_socket
from tests.support.counters.endpoints import COUNTER, Account, Reported, Spend, Tally
from tests.support.counters.harness import take, token_envelope
from tests.support.counters.registry import REGISTRY, SPEC
from tests.support.world import crash

REGION = "eu-west-1"
TOKEN, LIMIT = "side-effects-token", 4096
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ACCOUNT, AMOUNT = "acct", 64


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """One moto S3 server for the module (server mode; each test makes its own bucket)."""
    server = MotoServer()
    try:
        yield server.start()
    finally:
        server.stop()


def counters_over_http(blobs: S3BlobStore, failpoints: str | None, http: HttpxRequests,
                       base: str) -> Workers:
    """The counters on memory stores and broker, with `blobs` and the `bank` callee at
    `base` (called through `http`); failpoints whose `crash` raises `Crash`."""
    settings = load_settings(service=SPEC)
    service = resolve_service(settings, REGISTRY)
    adapters = memory_adapters(service, ManualClock(), SeededIds(11), CountingSink(),
                               MemoryBroker(), MemoryTokenStore(), blobs,
                               Failpoints.from_spec(failpoints, crash))
    callees: dict[str, HttpCallee] = {}
    adapters = replace(adapters, http=InProcessHttp(callees, http), callee_urls={"bank": base},
                       local_callees=callees)
    return workers_of(service, adapters, tunables_of(settings))


@dataclass
class Wired:
    """The counters with S3 blobs and the bank served over HTTP."""

    system: Workers
    base: str
    client: httpx.AsyncClient
    blobs: S3BlobStore
    http: HttpxRequests

    @property
    def broker(self) -> MemoryBroker:
        broker = self.system.dispatcher
        assert isinstance(broker, MemoryBroker)
        return broker

    @property
    def tokens(self) -> MemoryTokenStore:
        tokens = self.system.tokens
        assert isinstance(tokens, MemoryTokenStore)
        return tokens

    @property
    def requests(self) -> MemoryRequestStore:
        requests = self.system.requests["bank"]
        assert isinstance(requests, MemoryRequestStore)
        return requests

    def store(self, name: str) -> MemoryTransactionalStore:
        store = self.system.stores[name]
        assert isinstance(store, MemoryTransactionalStore)
        return store

    def url(self, request_id: uuid.UUID | str) -> str:
        return f"{self.base}/requests/{request_id}"

    def count(self, endpoint: str, event: str) -> int:
        events = self.system.events
        assert isinstance(events, CountingSink)
        return events.counts[(endpoint, event)]

    def runs(self, endpoint: str = "bank") -> int:
        return self.count(endpoint, HANDLER_INVOKED)

    def tally(self) -> Tally:
        tally = self.store("counter").partitions[ACCOUNT].state
        assert isinstance(tally, Tally)
        return tally

    def balance(self) -> int:
        account = self.store("bank").partitions[ACCOUNT].state
        assert isinstance(account, Account)
        return account.balance

    def counter_processor(self, spec: str | None = None, **ports: Any) -> Processor:
        """A counter worker with its own failpoints (`crash` raises `Crash`) and ports."""
        return build_processor(COUNTER, replace(self.system.ports("counter"), **ports),
                               Strategy.TOKEN, Failpoints.from_spec(spec, crash))


@asynccontextmanager
async def wired(moto_endpoint: str, failpoints: str | None = None, balance: int = 500,
                ) -> AsyncIterator[Wired]:
    """A fresh bucket, uvicorn on a free port serving the bank, and the counters."""
    async with s3_client_resource(moto_endpoint, REGION, "side-effects", "moto-secret") as s3:
        bucket = f"side-effects-{uuid.uuid4().hex[:12]}"
        await ensure_bucket(s3, bucket)
        blobs = S3BlobStore(s3, bucket)
        sock = listening_socket("127.0.0.1", 0)
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        resource = http_client_resource(5.0)
        client = await anext(resource)
        http = HttpxRequests(client, {base: TOKEN})
        w = Wired(counters_over_http(blobs, failpoints, http, base), base, client, blobs, http)
        w.store("bank").seed_state(ACCOUNT, Account(balance))
        server = StatusServer(create_callee_app(w.system.callees["bank"], TOKEN, LIMIT), sock)
        server.start()
        try:
            yield w
        finally:
            await resource.aclose()
            await server.stop()


async def _spend(w: Wired, amount: int = AMOUNT) -> Envelope:
    """A `Spend` of `amount` from the account's counter, its token created."""
    spend = token_envelope(Spend(ACCOUNT, amount), uuid.uuid4())
    await w.system.tokens.create("counter", [spend])
    return spend


async def _submitted(w: Wired, amount: int = AMOUNT) -> tuple[Envelope, uuid.UUID]:
    """Process a `Spend`: returns its follow-up (taken and acked from the broker) and the ID
    of the request stored on the bank."""
    spend = await _spend(w, amount)
    assert await w.system.processor("counter").process(spend) is Outcome.PROCESSED
    assert (w.tally().spent, w.tally().refused, len(w.tally().receipts)) == ((), (), 1)
    (request_id,) = w.requests.requests
    follow_up = await take(w.broker, "counter")
    await follow_up.ack()
    assert follow_up.envelope.type == "Spent"
    assert follow_up.envelope.header(REQUEST_URL_HEADER) == w.url(request_id)
    return follow_up.envelope, request_id


async def _assert_settled(w: Wired, debited: bool, strays: tuple[str, ...] = ()) -> None:
    """The oracle every case ends with: debited or refused once, reported once, one
    receipt, nothing else left behind; `strays` are objects only the deferred clean-up may
    remove (gone after the sweep)."""
    system, broker = w.system, w.broker
    tally = w.tally()
    assert (tally.spent, tally.refused) == (((AMOUNT,), ()) if debited else ((), (AMOUNT,)))
    assert len(set(tally.applied)) == len(tally.applied) == 2  # the Spend and its Spent
    assert broker.depth("counter") == 0
    assert broker.depth("audit") == 1  # reported exactly once
    event = (await take(broker, "audit")).envelope
    report = decode(Reported, event.body)
    assert (event.type, report.amount, report.status) == ("Reported", AMOUNT,
                                                          200 if debited else 409)
    assert set(w.tokens.rows) == {event.message_id}  # only the audit's token
    assert len(tally.receipts) == 1
    assert await w.blobs.keys() == sorted([*tally.receipts, *strays])
    assert not w.requests.requests  # tombstones are fine
    assert not w.store("bank").replies
    assert w.runs() == 1
    for name in ("counter", "bank"):
        store = w.store(name)
        assert store.record_count() == 0, name
        assert all(p.tr.message_id is None for p in store.partitions.values()), name
    clock = system.clock
    assert isinstance(clock, ManualClock)
    clock.advance(system.grace + timedelta(seconds=1))
    for name in ("counter", "bank"):
        report_ = await system.sweeper(name).sweep()
        assert (report_.finished, report_.taken_over) == (0, 0), name
        assert not w.store(name).cleanups, name
    assert await w.blobs.keys() == list(tally.receipts)
    assert not w.requests.requests


# --- 1. crash after the PUT -----------------------------------------------------------------


async def test_crash_after_put_leaves_a_request_the_next_winner_deletes(
    moto_endpoint: str,
) -> None:
    async with wired(moto_endpoint) as w:
        spend = await _spend(w)
        with pytest.raises(Crash):
            await w.counter_processor("after_put=crash").process(spend)
        abandoned = set(w.requests.requests)
        assert len(abandoned) == 1  # PUT over HTTP, then the crash
        (orphan,) = await w.blobs.keys()  # its receipt was uploaded before the PUT
        assert w.broker.depth("counter") == 0  # no follow-up sent

        # redelivery: processed normally, the winner's finish cleans the loser's artifacts
        assert await w.system.processor("counter").process(spend) is Outcome.PROCESSED
        assert abandoned.isdisjoint(w.requests.requests)
        assert abandoned <= set(w.requests.tombstones)
        assert len(w.requests.requests) == 1  # the winner's
        assert await w.blobs.keys() == list(w.tally().receipts) != [orphan]

        follow_up = await take(w.broker, "counter")
        assert await w.system.consumer("counter").settle(follow_up) is Outcome.PROCESSED
        assert w.balance() == 500 - AMOUNT
        await _assert_settled(w, debited=True)


# --- 2. lost reply after the callee's commit ------------------------------------------------


@pytest.mark.parametrize("point", ["callee.after_commit", "callee.before_reply"])
async def test_a_reply_lost_after_the_callee_commit_is_the_same_on_retry(
    moto_endpoint: str, point: str
) -> None:
    async with wired(moto_endpoint, f"{point}=raise@1") as w:
        spend = await _spend(w)
        assert await w.system.processor("counter").process(spend) is Outcome.PROCESSED
        consumer = w.system.consumer("counter")
        lost = await take(w.broker, "counter")
        assert await consumer.settle(lost) is Outcome.RETRIED  # 503: delayed redelivery
        assert (w.runs(), w.balance()) == (1, 500 - AMOUNT)  # committed before the loss
        assert w.tally().spent == ()
        retry = await take(w.broker, "counter")
        assert retry.envelope.message_id == lost.envelope.message_id
        assert await consumer.settle(retry) is Outcome.PROCESSED
        assert (w.runs(), w.balance()) == (1, 500 - AMOUNT)
        await _assert_settled(w, debited=True)


# --- 3. concurrent POSTs --------------------------------------------------------------------


async def test_five_concurrent_posts_through_httpx_execute_once(moto_endpoint: str) -> None:
    async with wired(moto_endpoint) as w:
        follow_up, request_id = await _submitted(w)
        answers = await asyncio.gather(*(w.http.post(w.url(request_id)) for _ in range(5)))
        assert {(a.status, a.stored) for a in answers} == {(200, True)}
        assert all(a == answers[0] for a in answers)
        assert dict(answers[0].body) == {"debited": AMOUNT}
        assert (w.runs(), w.balance()) == (1, 500 - AMOUNT)
        # the follow-up's own POST gets the same stored answer
        assert await w.system.processor("counter").process(follow_up) is Outcome.PROCESSED
        assert (w.runs(), w.balance()) == (1, 500 - AMOUNT)
        await _assert_settled(w, debited=True)


# --- 4. a refusal stays a refusal -----------------------------------------------------------


async def test_a_refusal_stays_the_same_on_every_retry(moto_endpoint: str) -> None:
    async with wired(moto_endpoint, balance=AMOUNT // 2) as w:
        follow_up, request_id = await _submitted(w)
        # the caller dies right after the POST: the refusal is stored, its answer lost
        with pytest.raises(Crash):
            await w.counter_processor("after_post=crash").process(follow_up)
        assert (w.tally().spent, w.tally().refused) == ((), ())
        # the account is topped up far beyond the amount: the stored refusal must not change
        w.store("bank").seed_state(ACCOUNT, Account(10_000))
        answers = [await w.http.post(w.url(request_id)) for _ in range(3)]
        assert {(a.status, a.stored) for a in answers} == {(409, True)}
        assert all(a == answers[0] for a in answers)
        assert answers[0].body["refused"] == "insufficient funds"
        assert await w.system.processor("counter").process(follow_up) is Outcome.PROCESSED
        assert (w.runs(), w.balance()) == (1, 10_000)
        await _assert_settled(w, debited=False)


# --- 5. crash after the follow-up's commit --------------------------------------------------


async def test_crash_after_the_follow_up_commit_still_deletes_the_request(
    moto_endpoint: str,
) -> None:
    async with wired(moto_endpoint) as w:
        spend = await _spend(w)
        assert await w.system.processor("counter").process(spend) is Outcome.PROCESSED
        (request_id,) = w.requests.requests
        broker = w.broker
        delivery = await take(broker, "counter", "worker-1")
        doomed = w.counter_processor("after_commit=crash")
        with pytest.raises(Crash):
            await doomed.process(delivery.envelope)
        assert w.tally().spent == (AMOUNT,)  # committed...
        assert request_id in w.requests.requests  # ...but the DELETE was not sent
        assert broker.depth("audit") == 0
        counter_runs = w.runs("counter")

        assert broker.drop_consumer("worker-1") == 1
        redelivered = await take(broker, "counter", "worker-2")
        assert redelivered.envelope == delivery.envelope
        assert await w.system.consumer("counter").settle(redelivered) is Outcome.DUPLICATE
        assert w.runs("counter") == counter_runs  # finished, not handled again
        assert request_id not in w.requests.requests  # DELETE sent over HTTP
        assert request_id in w.requests.tombstones
        await _assert_settled(w, debited=True)


# --- 6. a late PUT after DELETE -------------------------------------------------------------


async def test_a_late_put_after_delete_is_410_through_httpx(moto_endpoint: str) -> None:
    async with wired(moto_endpoint) as w:
        follow_up, request_id = await _submitted(w)
        stored = await w.requests.get(request_id)
        assert stored is not None
        assert await w.system.processor("counter").process(follow_up) is Outcome.PROCESSED
        with pytest.raises(RequestDeleted, match="410"):  # a Conflict: that attempt lost
            await w.http.put(w.url(request_id), stored.body)  # the same body, once more
        assert not w.requests.requests  # not resurrected
        await _assert_settled(w, debited=True)


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
        spend = await _spend(w)
        paused = _PausedPut(w.http)
        stalled = w.counter_processor(http=paused)
        task = asyncio.create_task(stalled.process(spend))
        await asyncio.wait_for(paused.started.wait(), 5.0)  # receipt uploaded, request registered
        assert await w.system.processor("counter").process(spend) is Outcome.PROCESSED
        ((_, late_url),) = paused.log
        assert uuid.UUID(late_url.rsplit("/", 1)[1]) in w.requests.tombstones
        paused.release.set()
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
        assert not isinstance(outcome, CalleeRefused), outcome  # never a dead letter
        assert not any(url == late_url for url in map(w.url, w.requests.requests))
        follow_up = await take(w.broker, "counter")
        assert await w.system.processor("counter").process(follow_up.envelope) is \
            Outcome.PROCESSED
        await _assert_settled(w, debited=True)
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is Outcome.DUPLICATE


# --- 7. an attempt stalled between register and upload --------------------------------------


@pytest.mark.parametrize("crash_after_upload", [False, True], ids=["recheck", "crash"])
async def test_an_upload_after_the_winner_finished_leaves_no_object(
    moto_endpoint: str, crash_after_upload: bool
) -> None:
    async with wired(moto_endpoint) as w:
        spend = await _spend(w)
        paused = _PausedPut(w.blobs)
        spec = "after_create:blob=crash" if crash_after_upload else None
        a = w.counter_processor(spec, blobs=paused)
        task = asyncio.create_task(a.process(spend))
        await asyncio.wait_for(paused.started.wait(), 5.0)  # A registered its receipt
        # B: a normal worker, runs to the end (commit, finish, token consumed)
        assert await w.system.processor("counter").process(spend) is Outcome.PROCESSED
        assert not await w.system.tokens.exists("counter", spend.message_id)
        ((_, a_key),) = paused.log
        (b_key,) = w.tally().receipts
        assert a_key != b_key
        assert await w.blobs.keys() == [b_key]  # B's clean-up deleted A's (absent) object
        assert w.count("counter", TRANSACTION_CONFLICT) == 0

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
            assert w.count("counter", TRANSACTION_CONFLICT) == 1
            assert await w.blobs.keys() == [b_key]
        follow_up = await take(w.broker, "counter")
        assert await w.system.processor("counter").process(follow_up.envelope) is \
            Outcome.PROCESSED
        await _assert_settled(w, debited=True, strays=strays)


# --- 8. credential and size limit -----------------------------------------------------------


async def test_unauthenticated_and_oversized_requests_are_refused(moto_endpoint: str) -> None:
    async with wired(moto_endpoint) as w:
        request_id = uuid.uuid4()
        body = b'{"account": "acct", "amount": 1}'
        anonymous = await w.client.put(w.url(request_id), content=body)
        assert (anonymous.status_code, anonymous.headers["WWW-Authenticate"]) == (401, "Bearer")
        big = await w.client.put(w.url(request_id), content=body + b" " * LIMIT, headers=AUTH)
        assert big.status_code == 413
        assert not w.requests.requests
        assert (await w.client.put(w.url(request_id), content=body, headers=AUTH)
                ).status_code == 201
