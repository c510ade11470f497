"""Protocol 6 on real HTTP: the payments callee app under uvicorn, the httpx caller adapter."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import date
from decimal import Decimal
from types import MappingProxyType
from urllib.parse import urlsplit

import httpx
import pytest

from adapters.http.client import CalleeRefused, HttpxRequests, http_client_resource
from adapters.memory.blob_store import MemoryBlobStore
from adapters.memory.broker import MemoryBroker
from adapters.memory.request_store import MemoryRequestStore
from adapters.memory.token_store import MemoryTokenStore
from adapters.system.clock import ManualClock, SeededIds
from application.codec import encode
from application.envelope import REQUEST_URL_HEADER, TOKEN_HEADER, Envelope
from application.errors import PermanentError, RequestDeleted, TransientError
from application.failpoints import Failpoints
from application.http_caller import collect_response
from application.observability import HANDLER_INVOKED, CountingSink
from application.processor import Outcome, Processor
from domain.context import HttpResponse
from domain.sample import ORDERS
from domain.sample.messages import AddItem, PaymentRequest, PlaceOrder, SubmitOrder, natural_id
from domain.sample.orders import CONFIRMED
from domain.sample.payments import open_account
from entrypoints.embedded import SampleSystem
from entrypoints.http_status import StatusServer
from entrypoints.payments_app import create_payments_app
from entrypoints.settings import Settings
from tests.support.world import crash

TOKEN, CUSTOMER, LIMIT = "s3cret-token", 7, 4096
R1, R2 = uuid.UUID(int=101), uuid.UUID(int=102)
STORED = "EO-Stored-Response"


def _body(amount: str, order: int = 1) -> bytes:
    return encode(PaymentRequest(order, CUSTOMER, Decimal(amount)))


@dataclass
class Callee:
    """A served callee: its system (memory stores), base URL, raw client and the adapter."""

    system: SampleSystem
    base: str
    client: httpx.AsyncClient
    http: HttpxRequests

    def url(self, request_id: uuid.UUID | str) -> str:
        return f"{self.base}/requests/{request_id}"

    def runs(self) -> int:
        events = self.system.events
        assert isinstance(events, CountingSink)
        return events.counts[("payments", HANDLER_INVOKED)]

    def balance(self) -> Decimal:
        return self.system.stores["payments"].partitions[str(CUSTOMER)].state.balance


@asynccontextmanager
async def serve(failpoints: str | None = None, balance: str = "500.00",
                timeout_s: float = 5.0) -> AsyncIterator[Callee]:
    """uvicorn on 127.0.0.1 (a free port) in this event loop, serving the payments callee."""
    system = SampleSystem(Settings(), ManualClock(), SeededIds(11), CountingSink(),
                          MemoryBroker(), MemoryTokenStore(), MemoryBlobStore(),
                          MemoryRequestStore(), Failpoints.from_spec(failpoints, crash))
    system.stores["payments"].seed_state(
        str(CUSTOMER), open_account(CUSTOMER, Decimal(balance), Decimal(0)))
    server = StatusServer(create_payments_app(system.callee, TOKEN, LIMIT), "127.0.0.1", 0)
    server.start()
    while not server.server.started:
        assert server.task is not None
        assert not server.task.done(), "uvicorn did not start"
        await asyncio.sleep(0.01)
    port = server.server.servers[0].sockets[0].getsockname()[1]
    resource = http_client_resource(timeout_s)
    client = await anext(resource)
    try:
        yield Callee(system, f"http://127.0.0.1:{port}", client, HttpxRequests(client, TOKEN))
    finally:
        await resource.aclose()
        await server.stop()


AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_put_is_create_only_and_a_late_put_after_delete_is_gone() -> None:
    async with serve() as c:
        answer = await c.client.put(c.url(R1), content=_body("10.00"), headers=AUTH)
        assert (answer.status_code, answer.json()["result"]) == (201, "created")
        await c.http.put(c.url(R1), _body("10.00"))  # same body again: 200
        with pytest.raises(CalleeRefused) as different:
            await c.http.put(c.url(R1), _body("99.00"))
        assert (different.value.status, different.value.body["result"]) == (409, "different")
        await c.http.delete(c.url(R1))
        with pytest.raises(RequestDeleted, match="410"):  # a Conflict: that attempt lost
            await c.http.put(c.url(R1), _body("10.00"))
        assert not c.system.requests.requests


async def test_five_concurrent_posts_execute_once_and_answer_identically() -> None:
    async with serve() as c:
        await c.http.put(c.url(R1), _body("50.00"))
        answers = await asyncio.gather(*(c.http.post(c.url(R1)) for _ in range(5)))
        assert {(a.status, a.stored) for a in answers} == {(200, True)}
        assert all(a == answers[0] for a in answers)
        assert dict(answers[0].body) == {"status": "approved", "order_key": 1, "amount": "50.00"}
        assert (c.runs(), c.balance()) == (1, Decimal("450.00"))


async def test_a_refusal_is_a_stored_409_that_stays_the_same_on_every_retry() -> None:
    async with serve(balance="100.00") as c:
        await c.http.put(c.url(R1), _body("150.00"))
        answers = [await c.http.post(c.url(R1)) for _ in range(3)]
        assert {(a.status, a.stored) for a in answers} == {(409, True)}
        assert answers[0].body["reason"] == "insufficient funds"
        assert all(a == answers[0] for a in answers)
        got = await c.client.get(c.url(R1), headers=AUTH)
        assert (got.status_code, got.headers[STORED], got.json()) == (409, "true", answers[0].body)
        assert await collect_response(c.http, c.url(R1), None) == HttpResponse(409, answers[0].body)
        assert (c.runs(), c.balance()) == (1, Decimal("100.00"))


@pytest.mark.parametrize("point", ["callee.before_reply", "callee.after_commit"])
async def test_a_reply_lost_after_the_callee_commit_is_the_same_on_retry(point: str) -> None:
    async with serve(f"{point}=raise@1") as c:
        await c.http.put(c.url(R1), _body("70.00"))
        lost = await c.http.post(c.url(R1))
        assert (lost.status, lost.stored) == (503, False)  # not a 500: the caller retries
        assert (c.runs(), c.balance()) == (1, Decimal("430.00"))  # committed before the loss
        retry = await collect_response(c.http, c.url(R1), None)
        assert retry == HttpResponse(200, {"status": "approved", "order_key": 1, "amount": "70.00"})
        assert (c.runs(), c.balance()) == (1, Decimal("430.00"))


@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Basic {TOKEN}", "Bearer"])
async def test_every_route_needs_the_bearer_token(auth: str | None) -> None:
    async with serve() as c:
        await c.http.put(c.url(R1), _body("10.00"))
        headers = {"Authorization": auth} if auth else {}
        for method in ("PUT", "POST", "GET", "DELETE"):
            answer = await c.client.request(method, c.url(R1), headers=headers,
                                            content=_body("10.00") if method == "PUT" else None)
            assert (answer.status_code, answer.headers["WWW-Authenticate"]) == (401, "Bearer")
            assert STORED not in answer.headers
        assert (c.runs(), R1 in c.system.requests.requests) == (0, True)
        assert (await c.client.get(f"{c.base}/health")).status_code == 200  # no token needed


async def test_a_wrong_token_is_a_permanent_error_for_the_caller() -> None:
    async with serve() as c:
        wrong = HttpxRequests(c.client, "not-the-token")
        assert "not-the-token" not in repr(wrong)
        for call in (wrong.put(c.url(R1), _body("1.00")), wrong.delete(c.url(R1))):
            with pytest.raises(CalleeRefused) as refused:
                await call
            assert refused.value.status == 401
        with pytest.raises(PermanentError, match="401"):
            await collect_response(wrong, c.url(R1), None)


async def test_a_caller_with_allowed_bases_sends_nothing_elsewhere() -> None:
    """The credential goes only to the configured callee: a URL under another base (one a
    message named) is a permanent error before any request leaves."""
    async with serve() as c:
        guarded = HttpxRequests(c.client, TOKEN, allowed_bases=[c.base])
        await guarded.put(c.url(R1), _body("1.00"))  # the callee itself: allowed
        elsewhere = f"http://127.0.0.2:{urlsplit(c.base).port}/requests/{R1}"
        for call in (guarded.put(elsewhere, _body("1.00")), guarded.post(elsewhere),
                     guarded.delete(elsewhere), guarded.put(c.base + "x/requests/1", b"{}")):
            with pytest.raises(PermanentError, match="not under a configured callee"):
                await call
        assert c.runs() == 0


async def _chunks(size: int) -> AsyncIterator[bytes]:
    for _ in range(size // 1024):
        yield b" " * 1024


async def test_an_oversized_body_is_413_whether_declared_or_streamed() -> None:
    async with serve() as c:
        big = _body("1.00") + b" " * LIMIT  # valid JSON, one byte too many at least
        with pytest.raises(CalleeRefused) as declared:
            await c.http.put(c.url(R1), big)
        streamed = await c.client.put(c.url(R2), content=_chunks(2 * LIMIT), headers=AUTH)
        assert (declared.value.status, streamed.status_code) == (413, 413)
        assert not c.system.requests.requests


async def test_unknown_requests_get_404_without_the_stored_header() -> None:
    async with serve() as c:
        post = await c.client.post(c.url(R1), headers=AUTH)
        assert (post.status_code, STORED in post.headers) == (404, False)
        assert await collect_response(c.http, c.url(R1), None) is None
        bad = await c.client.post(c.url("not-a-uuid"), headers=AUTH)
        assert bad.status_code == 422
        assert c.runs() == 0


async def test_get_before_and_after_and_an_idempotent_delete() -> None:
    async with serve() as c:
        await c.http.put(c.url(R1), _body("20.00"))
        before = await c.client.get(c.url(R1), headers=AUTH)
        assert (before.status_code, STORED in before.headers) == (404, False)
        posted = await c.http.post(c.url(R1))
        after = await c.client.get(c.url(R1), headers=AUTH)
        assert (after.status_code, after.headers[STORED], after.json()) == (200, "true",
                                                                           posted.body)
        for request_id in (R1, R1, R2):  # R2 was never stored: a tombstone all the same
            answer = await c.client.delete(c.url(request_id), headers=AUTH)
            assert (answer.status_code, answer.content) == (204, b"")
        assert (await c.client.get(c.url(R1), headers=AUTH)).status_code == 404
        assert (await c.http.post(c.url(R1))).status == 404
        await c.http.delete(c.url(R1))  # the adapter: 204 and 404 both mean "gone"
        assert set(c.system.requests.tombstones) == {R1, R2}


async def test_a_503_is_transient_for_the_caller() -> None:
    async with serve() as c:
        store = c.system.stores["payments"]
        real_commit = store.commit

        async def unreachable(*args: object, **kwargs: object) -> None:
            store.commit = real_commit
            raise TransientError("connection lost before COMMIT")

        store.commit = unreachable
        await c.http.put(c.url(R1), _body("70.00"))
        with pytest.raises(TransientError, match="503"):
            await collect_response(c.http, c.url(R1), None)
        retry = await collect_response(c.http, c.url(R1), None)
        assert retry is not None
        assert retry.status == 200


async def test_timeouts_and_refused_connections_are_transient() -> None:
    async with serve("callee.before_reply=sleep:1000@1", timeout_s=0.2) as c:
        await c.http.put(c.url(R1), _body("10.00"))
        with pytest.raises(TransientError, match="ReadTimeout"):
            await c.http.post(c.url(R1))
        closed = HttpxRequests(c.client, TOKEN)
        for call in (closed.put("http://127.0.0.1:1/requests/x", b"{}"),
                     closed.post("http://127.0.0.1:1/requests/x"),
                     closed.delete("http://127.0.0.1:1/requests/x")):
            with pytest.raises(TransientError, match="ConnectError"):
                await call
        with pytest.raises(PermanentError, match="UnsupportedProtocol"):
            await closed.post("inproc://payments/requests/x")


async def test_the_openapi_document_describes_routes_responses_and_the_bearer_scheme() -> None:
    async with serve() as c:
        doc = (await c.client.get(f"{c.base}/openapi.json")).json()
        routes = doc["paths"]["/requests/{request_id}"]
        expected = {"put": {"200", "201", "409", "410"}, "post": {"200", "404", "409", "503"},
                    "get": {"200", "404"}, "delete": {"204"}}
        for method, codes in expected.items():
            assert codes | {"401", "413", "422"} <= set(routes[method]["responses"])
            assert routes[method]["security"] == [{"bearer": []}]
        assert STORED in routes["post"]["responses"]["200"]["headers"]
        assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        assert "/health" in doc["paths"]


def _envelope(message: object, *parts: object) -> Envelope:
    name = type(message).__name__
    return Envelope(natural_id(name, *parts), name, encode(message),
                    MappingProxyType({TOKEN_HEADER: "1"}))


async def test_the_orders_caller_pays_over_http_and_deletes_the_request() -> None:
    async with serve() as c:
        s = c.system
        # the embedded wiring of orders, with the HTTP caller instead of the in-process one
        ports = replace(s.ports("orders"), http=c.http, services={"payments": c.base})
        orders = Processor(ORDERS, ports, s.settings.strategy("orders"))
        messages = [_envelope(PlaceOrder(1, CUSTOMER, date(1996, 1, 2), "1-URGENT", 1), 1),
                    _envelope(AddItem(1, 1, 155, Decimal(1), Decimal("100.00"), Decimal(0),
                                      Decimal(0)), 1, 1), _envelope(SubmitOrder(1, 0), 1)]
        await s.tokens.create(messages)
        for envelope in messages:
            assert await orders.process(envelope) is Outcome.PROCESSED
        (request_id,) = s.requests.requests  # PUT over HTTP
        deliveries = s.broker.consume("orders", "test")
        follow_up = await asyncio.wait_for(anext(deliveries), 1.0)
        await deliveries.aclose()
        assert follow_up.envelope.header(REQUEST_URL_HEADER) == c.url(request_id)
        assert await orders.process(follow_up.envelope) is Outcome.PROCESSED  # POST, DELETE
        assert s.stores["orders"].partitions["1"].state.status == CONFIRMED
        assert (c.runs(), c.balance()) == (1, Decimal("400.00"))
        assert not s.requests.requests
        assert request_id in s.requests.tombstones
