"""One contract suite for `ThirdPartyApis` (protocol 12), run against the in-process sandbox
(`SandboxApis`) and the httpx adapter (`HttpxApis`) calling the fake provider
(tools/fake_provider.py) in a process of its own, on a free port.

What both must do (application/ports.py `ThirdPartyApis`): a request goes out with its
`Idempotency-Key`, so a key repeated gets the first answer and the provider executes it once,
while distinct keys execute separately; the answer is the provider's status and JSON body as
they came (a provider failing with a 503 included: an answer, not an error); an API not
configured is a `PermanentError` before anything is sent; a request slower than the API's
timeout is a `TransientError`, the provider going on with it, so the key repeated later gets
that one execution's answer.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest

from adapters.http.apis import ApiEndpoint, HttpxApis
from adapters.memory.apis import IdempotentProvider, SandboxApis
from application.errors import PermanentError, TransientError
from application.ports import ThirdPartyApis
from tools.fake_provider import FakeProvider, fake_provider

API = "payments"


@dataclass
class Provider:
    """An adapter under test with the provider behind it: `apis` reaches it as API `API`;
    `faults(fail_next, latency_s)` makes it answer the next `fail_next` requests 503 and
    take `latency_s` seconds per execution; `executions()` counts its executions per key and
    `requests()` the requests it answered."""

    apis: ThirdPartyApis
    faults: Callable[[int, float], None]
    executions: Callable[[], dict[str, int]]
    requests: Callable[[], int]


def _charge(amount: int) -> bytes:
    return json.dumps({"amount": amount, "currency": "eur"}).encode()


class ThirdPartyApisContract:
    """The `ThirdPartyApis` contract; an adapter's class gives `make(timeout_s)`, the API's
    timeout in seconds."""

    def make(self, timeout_s: float = 10.0) -> AbstractAsyncContextManager[Provider]:
        raise NotImplementedError

    async def test_a_repeated_key_gets_the_first_answer_and_executes_once(self) -> None:
        async with self.make() as p:
            key = str(uuid.uuid4())
            answers = [await p.apis.send(API, "POST", "/charges", _charge(12), key)
                       for _ in range(3)]
            assert all(a == answers[0] for a in answers)
            assert p.executions() == {key: 1}

    async def test_distinct_keys_execute_separately(self) -> None:
        async with self.make() as p:
            keys = [str(uuid.uuid4()) for _ in range(3)]
            answers = await asyncio.gather(*(p.apis.send(API, "POST", "/charges", _charge(5), k)
                                             for k in keys))
            assert len({a.body["id"] for a in answers}) == 3
            assert p.executions() == dict.fromkeys(keys, 1)

    async def test_the_answer_is_the_providers_status_and_json_body(self) -> None:
        async with self.make() as p:
            key = str(uuid.uuid4())
            answer = await p.apis.send(API, "POST", "/charges", _charge(40), key)
            assert answer.status == 201
            assert dict(answer.body) == {
                "id": str(uuid.uuid5(uuid.NAMESPACE_URL, key)), "object": "charges",
                "method": "POST", "request": {"amount": 40, "currency": "eur"}}
            assert answer.retry_after_s is None
            reused = await p.apis.send(API, "POST", "/charges", _charge(41), key)
            assert reused.status == 422  # the key with another body: refused, as it came
            assert p.executions() == {key: 1}

    async def test_a_failing_provider_answers_its_503_and_runs_nothing(self) -> None:
        async with self.make() as p:
            p.faults(1, 0.0)
            key = str(uuid.uuid4())
            failed = await p.apis.send(API, "POST", "/charges", _charge(7), key)
            assert failed.status == 503
            assert p.executions() == {}
            again = await p.apis.send(API, "POST", "/charges", _charge(7), key)
            assert again.status == 201
            assert p.executions() == {key: 1}

    async def test_an_api_not_configured_is_permanent_and_sends_nothing(self) -> None:
        async with self.make() as p:
            with pytest.raises(PermanentError, match="'shipping'"):
                await p.apis.send("shipping", "POST", "/labels", _charge(1), str(uuid.uuid4()))
            assert p.requests() == 0

    async def test_a_provider_slower_than_the_timeout_is_transient_and_runs_once(
            self) -> None:
        async with self.make(timeout_s=0.2) as p:
            p.faults(0, 0.6)
            key = str(uuid.uuid4())
            with pytest.raises(TransientError):
                await p.apis.send(API, "POST", "/charges", _charge(9), key)
            p.faults(0, 0.0)
            await asyncio.sleep(0.8)  # the provider finished the first request meanwhile
            answer = await p.apis.send(API, "POST", "/charges", _charge(9), key)
            assert answer.status == 201
            assert p.executions() == {key: 1}


class TestSandboxApis(ThirdPartyApisContract):
    """The embedded profile's sandbox: the provider in the test's process."""

    @asynccontextmanager
    async def make(self, timeout_s: float = 10.0) -> AsyncIterator[Provider]:
        provider = IdempotentProvider()

        def faults(fail_next: int, latency_s: float) -> None:
            provider.fail_next, provider.latency_s = fail_next, latency_s

        yield Provider(SandboxApis(provider, apis=[API], timeout_s=timeout_s), faults,
                       lambda: dict(provider.executions), lambda: provider.requests)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeProvider]:
    with fake_provider(tmp_path_factory.mktemp("provider") / "provider.log") as started:
        yield started


class TestHttpxApis(ThirdPartyApisContract):
    """The httpx adapter against tools/fake_provider.py, served by uvicorn in a process of
    its own on a free port (reset before each test)."""

    @pytest.fixture(autouse=True)
    def _served(self, served: FakeProvider) -> None:
        served.reset()
        self.served = served

    @asynccontextmanager
    async def make(self, timeout_s: float = 10.0) -> AsyncIterator[Provider]:
        served = self.served
        async with httpx.AsyncClient() as client:
            yield Provider(HttpxApis(client, {API: ApiEndpoint(served.url, None, timeout_s)}),
                           lambda fail_next, latency_s: served.faults(fail_next, latency_s),
                           lambda: dict(served.stats()["executions"]),
                           lambda: int(served.stats()["requests"]))

    async def test_an_unreachable_provider_is_transient(self) -> None:
        """A network error (nothing listens there): the sandbox has no network to fail."""
        async with httpx.AsyncClient() as client:
            apis = HttpxApis(client, {API: ApiEndpoint("http://127.0.0.1:1", None, 2.0)})
            with pytest.raises(TransientError, match="ConnectError"):
                await apis.send(API, "POST", "/charges", _charge(1), str(uuid.uuid4()))

