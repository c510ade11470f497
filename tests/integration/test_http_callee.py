"""Protocol 6 on real HTTP: the counters' `bank` callee app under uvicorn, the httpx caller.

Most tests serve the callee app in this event loop on memory stores (the counters' embedded
wiring, tests/support/counters/harness.py); the last one runs `eo serve --endpoint bank` as
a process on PostgreSQL, on port 0, and reads its URL from its `callee.serving` log line.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from adapters.http.client import CalleeRefused, HttpxRequests, http_client_resource
from adapters.postgres.pool import create_pool
from application.assembly import build_processor
from application.codec import to_jsonable
from application.envelope import REQUEST_URL_HEADER
from application.errors import PermanentError, RequestDeleted, TransientError
from application.http_caller import collect_response
from application.outcome import Outcome
from domain.context import HttpResponse
from tests.support.callee import ACCOUNT, LIMIT, TOKEN, serve, withdrawal
from tests.support.counters.endpoints import Account, Spend, Tally
from tests.support.counters.harness import take, token_envelope
from tests.support.processes import Where, fresh_fleet, states, where_for

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

R1, R2 = uuid.UUID(int=101), uuid.UUID(int=102)
STORED = "EO-Stored-Response"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
_body = withdrawal


async def test_put_is_create_only_and_a_late_put_after_delete_is_gone() -> None:
    async with serve() as c:
        answer = await c.client.put(c.url(R1), content=_body(16), headers=AUTH)
        assert (answer.status_code, answer.json()["result"]) == (201, "created")
        await c.http.put(c.url(R1), _body(16))  # same body again: 200
        with pytest.raises(CalleeRefused) as different:
            await c.http.put(c.url(R1), _body(128))
        assert (different.value.status, different.value.body["result"]) == (409, "different")
        await c.http.delete(c.url(R1))
        with pytest.raises(RequestDeleted, match="410"):  # a Conflict: that attempt lost
            await c.http.put(c.url(R1), _body(16))
        assert not c.counters.requests.requests


async def test_five_concurrent_posts_execute_once_and_answer_identically() -> None:
    async with serve() as c:
        await c.http.put(c.url(R1), _body(64))
        answers = await asyncio.gather(*(c.http.post(c.url(R1)) for _ in range(5)))
        assert {(a.status, a.stored) for a in answers} == {(200, True)}
        assert all(a == answers[0] for a in answers)
        assert dict(answers[0].body) == {"debited": 64}
        assert (c.runs(), c.balance()) == (1, 500 - 64)


async def test_a_refusal_is_a_stored_409_that_stays_the_same_on_every_retry() -> None:
    async with serve(balance=100) as c:
        await c.http.put(c.url(R1), _body(128))
        answers = [await c.http.post(c.url(R1)) for _ in range(3)]
        assert {(a.status, a.stored) for a in answers} == {(409, True)}
        assert answers[0].body["refused"] == "insufficient funds"
        assert all(a == answers[0] for a in answers)
        got = await c.client.get(c.url(R1), headers=AUTH)
        assert (got.status_code, got.headers[STORED], got.json()) == (409, "true", answers[0].body)
        assert await collect_response(c.http, c.url(R1), None) == HttpResponse(409, answers[0].body)
        assert (c.runs(), c.balance()) == (1, 100)


async def test_a_rejected_request_is_422_and_stores_no_reply() -> None:
    async with serve() as c:
        await c.http.put(c.url(R1), _body(-4))
        for _ in range(2):  # the handler rejects it again: nothing was stored to answer
            answer = await c.client.post(c.url(R1), headers=AUTH)
            assert (answer.status_code, STORED in answer.headers) == (422, False)
            assert answer.json()["error"] == "rejected by handler: negative amount -4"
        assert (await c.client.get(c.url(R1), headers=AUTH)).status_code == 404
        assert c.balance() == 500


@pytest.mark.parametrize("point", ["callee.before_reply", "callee.after_commit"])
async def test_a_reply_lost_after_the_callee_commit_is_the_same_on_retry(point: str) -> None:
    async with serve(f"{point}=raise@1") as c:
        await c.http.put(c.url(R1), _body(64))
        lost = await c.http.post(c.url(R1))
        assert (lost.status, lost.stored) == (503, False)  # not a 500: the caller retries
        # what failed inside stays in the log (the security review: 503s echoed it)
        assert lost.body == {"error": "temporarily unavailable: retry"}
        assert (c.runs(), c.balance()) == (1, 500 - 64)  # committed before the loss
        retry = await collect_response(c.http, c.url(R1), None)
        assert retry == HttpResponse(200, {"debited": 64})
        assert (c.runs(), c.balance()) == (1, 500 - 64)


@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Basic {TOKEN}", "Bearer"])
async def test_every_route_needs_the_bearer_token(auth: str | None) -> None:
    async with serve() as c:
        await c.http.put(c.url(R1), _body(16))
        headers = {"Authorization": auth} if auth else {}
        for method in ("PUT", "POST", "GET", "DELETE"):
            answer = await c.client.request(method, c.url(R1), headers=headers,
                                            content=_body(16) if method == "PUT" else None)
            assert (answer.status_code, answer.headers["WWW-Authenticate"]) == (401, "Bearer")
            assert STORED not in answer.headers
        assert (c.runs(), R1 in c.counters.requests.requests) == (0, True)
        assert (await c.client.get(f"{c.base}/health")).status_code == 200  # no token needed


async def test_a_wrong_token_is_a_permanent_error_for_the_caller() -> None:
    async with serve() as c:
        wrong = HttpxRequests(c.client, {c.base: "not-the-token"})
        assert "not-the-token" not in repr(wrong)
        for call in (wrong.put(c.url(R1), _body(1)), wrong.delete(c.url(R1))):
            with pytest.raises(CalleeRefused) as refused:
                await call
            assert refused.value.status == 401
        with pytest.raises(PermanentError, match="401"):
            await collect_response(wrong, c.url(R1), None)


async def test_the_caller_sends_each_token_only_under_its_base() -> None:
    """The credential goes only to the configured callee: a URL under another base (one a
    message named) is a permanent error before any request leaves."""
    async with serve() as c:
        guarded = HttpxRequests(c.client, {c.base: TOKEN})
        await guarded.put(c.url(R1), _body(1))  # the callee itself: allowed
        elsewhere = f"http://127.0.0.2:{urlsplit(c.base).port}/requests/{R1}"
        for call in (guarded.put(elsewhere, _body(1)), guarded.post(elsewhere),
                     guarded.delete(elsewhere), guarded.put(c.base + "x/requests/1", b"{}")):
            with pytest.raises(PermanentError, match="not under a configured callee"):
                await call
        assert c.runs() == 0


async def test_one_caller_sends_each_callee_its_own_token() -> None:
    async with serve() as first, serve(token="another-token") as second:
        both = HttpxRequests(first.client, {first.base: TOKEN, second.base: "another-token"})
        for callee in (first, second):  # a token sent to the other callee would be a 401
            await both.put(callee.url(R1), _body(8))
            answer = await both.post(callee.url(R1))
            assert (answer.status, dict(answer.body)) == (200, {"debited": 8})
            assert (callee.runs(), callee.balance()) == (1, 500 - 8)


async def _chunks(size: int) -> AsyncIterator[bytes]:
    for _ in range(size // 1024):
        yield b" " * 1024


async def test_an_oversized_body_is_413_whether_declared_or_streamed() -> None:
    async with serve() as c:
        big = _body(1) + b" " * LIMIT  # valid JSON, one byte too many at least
        with pytest.raises(CalleeRefused) as declared:
            await c.http.put(c.url(R1), big)
        streamed = await c.client.put(c.url(R2), content=_chunks(2 * LIMIT), headers=AUTH)
        assert (declared.value.status, streamed.status_code) == (413, 413)
        assert not c.counters.requests.requests


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
        await c.http.put(c.url(R1), _body(32))
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
        assert set(c.counters.requests.tombstones) == {R1, R2}


async def test_a_503_is_transient_for_the_caller() -> None:
    async with serve() as c:
        store = c.counters.store("bank")
        real_commit = store.commit

        async def unreachable(*args: object, **kwargs: object) -> None:
            store.commit = real_commit
            raise TransientError("connection lost before COMMIT")

        store.commit = unreachable
        await c.http.put(c.url(R1), _body(64))
        with pytest.raises(TransientError, match="503"):
            await collect_response(c.http, c.url(R1), None)
        retry = await collect_response(c.http, c.url(R1), None)
        assert retry == HttpResponse(200, {"debited": 64})
        assert (c.runs(), c.balance()) == (2, 500 - 64)  # the lost commit changed nothing


async def test_timeouts_and_refused_connections_are_transient() -> None:
    async with serve("callee.before_reply=sleep:3000@1", timeout_s=1.5) as c:
        await c.http.put(c.url(R1), _body(16))
        with pytest.raises(TransientError, match="ReadTimeout"):
            await c.http.post(c.url(R1))
        closed = HttpxRequests(c.client, {"http://127.0.0.1:1": TOKEN,
                                          "inproc://bank": TOKEN})
        for call in (closed.put("http://127.0.0.1:1/requests/x", b"{}"),
                     closed.post("http://127.0.0.1:1/requests/x"),
                     closed.delete("http://127.0.0.1:1/requests/x")):
            with pytest.raises(TransientError, match="ConnectError"):
                await call
        with pytest.raises(PermanentError, match="UnsupportedProtocol"):
            await closed.post("inproc://bank/requests/x")


async def test_the_openapi_document_describes_routes_responses_and_the_bearer_scheme() -> None:
    async with serve() as c:
        assert (await c.client.get(f"{c.base}/openapi.json")).status_code == 401
        doc = (await c.client.get(f"{c.base}/openapi.json", headers=AUTH)).json()
        routes = doc["paths"]["/requests/{request_id}"]
        expected = {"put": {"200", "201", "409", "410"}, "post": {"200", "404", "409", "503"},
                    "get": {"200", "404"}, "delete": {"204"}}
        for method, codes in expected.items():
            assert codes | {"401", "413", "422"} <= set(routes[method]["responses"])
            assert routes[method]["security"] == [{"bearer": []}]
        assert STORED in routes["post"]["responses"]["200"]["headers"]
        assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        body = routes["put"]["requestBody"]["content"]["application/json"]["schema"]
        assert set(body["properties"]) == {"account", "amount"}  # the bank's Withdraw
        assert "/health" in doc["paths"]


async def test_the_counter_spends_over_http_and_deletes_the_request() -> None:
    async with serve() as c:
        s = c.counters.system
        # the embedded wiring of counter, with the HTTP caller instead of the in-process one
        ports = replace(s.ports("counter"), http=c.http, services={"bank": c.base})
        counter = build_processor(s.registry["counter"].endpoint, ports,
                                  s.strategy("counter"))
        spend = token_envelope(Spend(ACCOUNT, 128), uuid.uuid4())
        await s.tokens.create("counter", [spend])
        assert await counter.process(spend) is Outcome.PROCESSED
        (request_id,) = c.counters.requests.requests  # PUT over HTTP
        follow_up = await take(c.counters.broker, "counter")
        await follow_up.ack()
        assert follow_up.envelope.header(REQUEST_URL_HEADER) == c.url(request_id)
        assert await counter.process(follow_up.envelope) is Outcome.PROCESSED  # POST, DELETE
        tally = c.counters.state("counter", ACCOUNT)
        assert isinstance(tally, Tally)
        assert (tally.spent, tally.refused) == ((128,), ())
        assert (c.runs(), c.balance()) == (1, 500 - 128)
        assert not c.counters.requests.requests
        assert request_id in c.counters.requests.tombstones
        report = await take(c.counters.broker, "audit")
        assert report.envelope.type == "Reported"


# ---------------------------------------------------------------------------------------------
# `eo serve --endpoint bank` as a process


@asynccontextmanager
async def pool_on(where: Where) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(where.dsn, max_size=1)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with where_for("eo_it_http_callee", "eo-it-http-callee") as found:
        yield found


async def test_eo_serve_answers_the_protocol_over_http_and_stops_on_sigterm(
    where: Where, tmp_path: Path,
) -> None:
    async with fresh_fleet(where, tmp_path, endpoints=()) as fleet, pool_on(where) as pool:
        await pool.execute("INSERT INTO eo_transaction_record (endpoint, partition_key, state) "
                           "VALUES ('bank', $1, $2)", ACCOUNT, to_jsonable(Account(100)))
        bank = fleet.serve("bank", TOKEN, max_body_bytes=LIMIT)
        await fleet.ready(bank)
        assert bank.url is not None
        base = urlsplit(bank.url)
        assert (base.hostname, base.port != 0) == ("127.0.0.1", True), bank.url
        resource = http_client_resource(5.0)
        client = await anext(resource)
        try:
            http = HttpxRequests(client, {bank.url: TOKEN})
            url = f"{bank.url}/requests/{R1}"
            assert (await client.put(url, content=_body(64))).status_code == 401
            assert (await client.put(url, content=_body(1) + b" " * LIMIT,
                                     headers=AUTH)).status_code == 413
            await http.put(url, _body(64))
            answers = await asyncio.gather(*(http.post(url) for _ in range(3)))
            assert {(a.status, a.stored, dict(a.body)["debited"]) for a in answers} == {
                (200, True, 64)}
            await http.delete(url)
            with pytest.raises(RequestDeleted, match="410"):
                await http.put(url, _body(64))
        finally:
            await resource.aclose()
        assert await states(pool, "bank", Account) == {ACCOUNT: Account(36, (64,))}
        assert await pool.fetchval("SELECT count(*) FROM eo_http_request") == 0
        assert len(bank.events("handler.invoked")) == 1
        bank.popen.send_signal(signal.SIGTERM)
        assert await fleet.exit_code(bank, 20) == 0, bank.tail()
