"""One contract suite for `HttpRequests`, the caller's side of the HTTP protocol (protocol 6),
run against the embedded profile's in-process fake (`InProcessHttp`) and the httpx adapter
(`HttpxRequests`) calling a real callee (the counters' `bank` app under uvicorn).

What both must do (`application.ports.HttpRequests`): PUT is create-only (the same body
again succeeds, another body is a `PermanentError`, a PUT after the DELETE is
`RequestDeleted`); POST returns the callee's answer as is (a stored 200 or 409 the same on
every retry, a 422 rejection not stored, a 503 after a reply lost past the callee's commit);
DELETE is idempotent and accepts an unknown request; a URL of no configured callee is a
`PermanentError` before anything is sent.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import pytest

from adapters.memory.http import InProcessHttp
from application.errors import PermanentError, RequestDeleted
from application.ports import HttpRequests, HttpResult
from tests.support.callee import ACCOUNT, BankView, serve, withdrawal
from tests.support.counters.harness import Counters, counters


@dataclass
class Caller(BankView):
    """An adapter under test with the callee it calls: `url(id)` is a request's URL,
    `foreign(id)` a URL under no configured callee."""

    http: HttpRequests
    counters: Counters
    url: Callable[[uuid.UUID], str]
    foreign: Callable[[uuid.UUID], str]


class HttpRequestsContract:
    """The `HttpRequests` contract; an adapter's class gives `make(failpoints, balance)`."""

    def make(self, failpoints: str | None = None, balance: int = 500
             ) -> AbstractAsyncContextManager[Caller]:
        raise NotImplementedError

    async def test_put_is_create_only_and_a_put_after_the_delete_is_request_deleted(
            self) -> None:
        async with self.make() as c:
            rid = uuid.uuid4()
            await c.http.put(c.url(rid), withdrawal(16))
            await c.http.put(c.url(rid), withdrawal(16))  # the same body again: accepted
            with pytest.raises(PermanentError, match="409"):
                await c.http.put(c.url(rid), withdrawal(128))
            await c.http.delete(c.url(rid))
            with pytest.raises(RequestDeleted, match="410"):  # that attempt lost
                await c.http.put(c.url(rid), withdrawal(16))
            assert rid not in c.counters.requests.requests
            assert c.runs() == 0

    async def test_concurrent_posts_execute_once_and_answer_the_stored_reply(self) -> None:
        async with self.make() as c:
            rid = uuid.uuid4()
            await c.http.put(c.url(rid), withdrawal(64))
            answers = await asyncio.gather(*(c.http.post(c.url(rid)) for _ in range(5)))
            assert all(a == HttpResult(200, answers[0].body, True) for a in answers)
            assert dict(answers[0].body) == {"debited": 64}
            assert (c.runs(), c.balance()) == (1, 500 - 64)

    async def test_a_refusal_is_a_stored_409_the_same_on_every_retry(self) -> None:
        async with self.make(balance=100) as c:
            rid = uuid.uuid4()
            await c.http.put(c.url(rid), withdrawal(128))
            answers = [await c.http.post(c.url(rid)) for _ in range(3)]
            assert {(a.status, a.stored) for a in answers} == {(409, True)}
            assert answers[0].body["refused"] == "insufficient funds"
            assert all(a == answers[0] for a in answers)
            assert (c.runs(), c.balance()) == (1, 100)

    async def test_a_rejected_request_is_a_422_stored_nowhere(self) -> None:
        async with self.make() as c:
            rid = uuid.uuid4()
            await c.http.put(c.url(rid), withdrawal(-4))
            for _ in range(2):
                answer = await c.http.post(c.url(rid))
                assert (answer.status, answer.stored) == (422, False)
                assert answer.body["error"] == "rejected by handler: negative amount -4"
            assert c.balance() == 500

    async def test_a_post_of_an_unknown_request_is_a_404(self) -> None:
        async with self.make() as c:
            answer = await c.http.post(c.url(uuid.uuid4()))
            assert (answer.status, answer.stored) == (404, False)
            assert c.runs() == 0

    async def test_a_reply_lost_after_the_callee_commit_is_a_503_then_the_stored_reply(
            self) -> None:
        async with self.make("callee.after_commit=raise@1") as c:
            rid = uuid.uuid4()
            await c.http.put(c.url(rid), withdrawal(64))
            lost = await c.http.post(c.url(rid))
            assert (lost.status, lost.stored) == (503, False)  # the caller retries a 503
            assert lost.body == {"error": "temporarily unavailable: retry"}
            again = await c.http.post(c.url(rid))
            assert (again.status, again.stored, dict(again.body)) == (200, True, {"debited": 64})
            assert (c.runs(), c.balance()) == (1, 500 - 64)

    async def test_delete_is_idempotent_and_accepts_an_unknown_request(self) -> None:
        async with self.make() as c:
            rid = uuid.uuid4()
            await c.http.put(c.url(rid), withdrawal(8))
            await c.http.post(c.url(rid))
            await c.http.delete(c.url(rid))
            await c.http.delete(c.url(rid))
            await c.http.delete(c.url(uuid.uuid4()))
            assert rid not in c.counters.requests.requests
            assert (c.runs(), c.balance()) == (1, 500 - 8)

    async def test_a_url_of_no_configured_callee_is_permanent_and_sends_nothing(self) -> None:
        async with self.make() as c:
            rid = uuid.uuid4()
            for call in (c.http.put(c.foreign(rid), withdrawal(1)), c.http.post(c.foreign(rid)),
                         c.http.delete(c.foreign(rid))):
                with pytest.raises(PermanentError):
                    await call
            assert not c.counters.requests.requests
            assert c.runs() == 0


class TestInProcessHttp(HttpRequestsContract):
    """The embedded profile's fake: `inproc://bank/...` straight to the callee object."""

    @asynccontextmanager
    async def make(self, failpoints: str | None = None, balance: int = 500
                   ) -> AsyncIterator[Caller]:
        c = counters(failpoints)
        c.open_account(ACCOUNT, balance)
        yield Caller(InProcessHttp({"bank": c.bank}), c,
                     lambda rid: f"inproc://bank/requests/{rid}",
                     lambda rid: f"inproc://nobody/requests/{rid}")


class TestHttpxRequests(HttpRequestsContract):
    """The httpx adapter against the callee app served by uvicorn on port 0."""

    @asynccontextmanager
    async def make(self, failpoints: str | None = None, balance: int = 500
                   ) -> AsyncIterator[Caller]:
        async with serve(failpoints, balance) as served:
            yield Caller(served.http, served.counters, served.url,
                         lambda rid: f"http://127.0.0.2:1/requests/{rid}")
