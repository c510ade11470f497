"""An in-process third-party API with idempotency keys (protocol 12): what the embedded
profile calls when no API URL is configured, and the core of the tests' fake provider
(tools/fake_provider.py serves it over HTTP).

`IdempotentProvider` keeps keys as Stripe documents its own: the answer to a key's first
request is stored for `window_s` seconds and returned to every repeat; a repeat while the
first still runs gets 409; a repeat with another method, path or body gets 422. A 5xx of its
own (`fail_next`, injected) is answered before anything runs and is not stored, as a
gateway in front of a provider fails."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from application.errors import PermanentError, TransientError
from application.ports import ApiResult, ThirdPartyApis

#: What the provider does with a new request: (status, JSON body) from method, path, body.
Business = Callable[[str, str, Any], tuple[int, Mapping[str, Any]]]


def created(method: str, path: str, body: Any) -> tuple[int, Mapping[str, Any]]:
    """The default business: 201 with an object ID, what was asked, and the body."""
    return 201, {"object": path.strip("/").split("/")[0] or "object", "method": method,
                 "request": body}


@dataclass
class _Key:
    fingerprint: str
    answer: ApiResult | None = None  # None: the first request still runs
    stored_at: float = 0.0


@dataclass
class IdempotentProvider:
    """Keys, answers and executions of one provider (see the module docstring).
    `executions` counts the business's runs per key; `requests` every request answered;
    `latency_s` delays each execution (a slow provider); `fail_next` answers that many
    requests 503 before running anything. `clock` gives seconds (monotonic)."""

    business: Business = created
    window_s: float = 24 * 3600.0
    latency_s: float = 0.0
    fail_next: int = 0
    clock: Callable[[], float] = time.monotonic
    keys: dict[str, _Key] = field(default_factory=dict)
    executions: Counter[str] = field(default_factory=Counter)
    requests: int = 0

    async def handle(self, method: str, path: str, body: bytes | None, key: str | None
                     ) -> ApiResult:
        """The answer to one request with `Idempotency-Key` `key` (None: no key, every
        request runs)."""
        self.requests += 1
        if self.fail_next > 0:
            self.fail_next -= 1
            return ApiResult(503, {"error": "temporarily unavailable (injected)"})
        try:
            parsed = None if body is None else json.loads(body)
        except ValueError:
            return ApiResult(400, {"error": "the body is not JSON"})
        if key is None:
            return await self._execute(method, path, parsed, None)
        fingerprint = hashlib.sha256(json.dumps([method, path, parsed], sort_keys=True)
                                     .encode()).hexdigest()
        known = self.keys.get(key)
        if known is not None and known.answer is not None and (
                self.clock() - known.stored_at >= self.window_s):
            known = None  # forgotten: the window passed
            del self.keys[key]
        if known is not None:
            if known.fingerprint != fingerprint:
                return ApiResult(422, {"error": f"idempotency key {key} was used with "
                                                "another request"})
            if known.answer is None:
                return ApiResult(409, {"error": f"a request with idempotency key {key} is "
                                                "still in progress"})
            return known.answer
        entry = self.keys[key] = _Key(fingerprint)
        try:
            answer = await self._execute(method, path, parsed, key)
        except BaseException:
            del self.keys[key]  # nothing stored: the next request runs it
            raise
        entry.answer, entry.stored_at = answer, self.clock()
        return answer

    async def _execute(self, method: str, path: str, body: Any, key: str | None
                       ) -> ApiResult:
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        self.executions[key or f"no-key-{self.requests}"] += 1
        status, answer = self.business(method, path, body)
        identity = uuid.uuid5(uuid.NAMESPACE_URL, key) if key else uuid.uuid4()
        return ApiResult(status, {"id": str(identity), **answer})


class SandboxApis(ThirdPartyApis):
    """`ThirdPartyApis` on one in-process `provider` (a new one by default): the stand-in
    for an API there is no URL for (nothing leaves the process). As the port promises:

    - `apis`: the API names it answers for; a request to another raises `PermanentError`
      before anything runs, as for an API not configured. None: every name (a route of
      `adapters.routed_apis.RoutedApis`, which refuses the undeclared names itself);
    - `timeout_s`: bound on one request in seconds (None: none); a slower request raises
      `TransientError` while the provider goes on with it, as a remote provider does."""

    def __init__(self, provider: IdempotentProvider | None = None,
                 apis: Collection[str] | None = None, timeout_s: float | None = None) -> None:
        self.provider = provider or IdempotentProvider()
        self.apis = None if apis is None else frozenset(apis)
        self.timeout_s = timeout_s
        self._running: set[asyncio.Task[ApiResult]] = set()

    async def send(self, api: str, method: str, path: str, body: bytes | None,
                   idempotency_key: str) -> ApiResult:
        if self.apis is not None and api not in self.apis:
            raise PermanentError(f"third-party API {api!r} is not configured in the sandbox")
        if self.timeout_s is None:
            return await self.provider.handle(method, path, body, idempotency_key)
        task = asyncio.create_task(self.provider.handle(method, path, body, idempotency_key))
        self._running.add(task)  # the provider's work goes on after a timeout
        task.add_done_callback(self._running.discard)
        done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        if not done:
            raise TransientError(f"{method} {api}{path}: no answer within {self.timeout_s} s")
        return task.result()
