"""Calls to third-party HTTP APIs through their `Idempotency-Key` header (protocol 12).

A handler asks for a call (`CallApi`); nothing is sent then. The request travels in the
follow-up message the commit creates (`API_CALL_HEADER`, its token keeps it), and processing
that follow-up sends it with `Idempotency-Key: <the follow-up's message ID>`: committed,
unique, the same on every delivery and attempt. The provider answers a repeated key with the
answer it stored the first time, so the request is executed once as long as the provider
keeps the key (`ApiPolicy.key_retention`): after that window the follow-up is dead-lettered,
never sent (`WindowExpired`), and a replay of it is refused too.

Answers, per try (`ApiCaller.call`):

- 2xx, and 4xx other than 409, 422 and 429: the answer, given to the follow-up's handler;
- a network error, a timeout, 5xx, 409 (the key's first request still running): sent again
  with the same key after `ApiPolicy.backoff_s`, `tries` times in all, then `TransientError`
  (the delivery is retried later: the same key again);
- 429: sent again after its `Retry-After` (at most `max_retry_after_s`);
- 422: the key came back with another body, which a committed body cannot do:
  `PermanentError` (dead-lettered with that reason).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from application.envelope import API_CALL_HEADER, API_DEADLINE_HEADER, Envelope
from application.errors import PermanentError, TransientError
from application.failpoints import NO_FAILPOINTS, Failpoints
from application.observability import API_CALLED
from application.ports import (
    ApiPolicy,
    ApiResult,
    Clock,
    EventSink,
    SpanKind,
    ThirdPartyApis,
    Tracer,
)
from application.ports.null_tracer import NULL_TRACER
from domain.context import HttpResponse
from domain.decisions import CallApi

#: The methods a `CallApi` may use.
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
#: The longest path a `CallApi` may name (characters).
MAX_PATH_CHARS = 2048


class WindowExpired(PermanentError):
    """The follow-up would be sent after the provider forgot its key: never sent (a send
    could execute the request a second time). Dead-lettered; a replay is refused."""

    def __init__(self, api: str, deadline: datetime) -> None:
        super().__init__(f"idempotency window expired: the request to {api} could not be sent "
                         f"before {deadline.isoformat()}, after which the provider may have "
                         "forgotten its key")


@dataclass(frozen=True)
class ApiRequest:
    """The committed request of a follow-up: which API, method, path and JSON body, and
    when it was prepared (before its commit: the window counts from there, so it closes no
    later than the provider's)."""

    api: str
    method: str
    path: str
    body: Mapping[str, Any] | None
    prepared_at: datetime

    @classmethod
    def of(cls, call: CallApi, prepared_at: datetime) -> ApiRequest:
        """The request of a handler's `call`, checked: a known method, a path under the
        base URL. Raises `PermanentError` (the handler's decision cannot be carried out)."""
        method = call.method.upper()
        if method not in METHODS:
            raise PermanentError(f"CallApi to {call.api}: method {call.method!r} is not one "
                                 f"of {sorted(METHODS)}")
        path = call.path
        if (not path.startswith("/") or path.startswith("//") or "://" in path
                or len(path) > MAX_PATH_CHARS or any(c in path for c in "\r\n ")):
            raise PermanentError(f"CallApi to {call.api}: path {path[:80]!r} is not a path "
                                 "under the API's base URL (it starts with one '/', has no "
                                 f"scheme, spaces or line breaks, at most {MAX_PATH_CHARS} "
                                 "characters)")
        body = None if call.body is None else dict(call.body)
        return cls(call.api, method, path, body, prepared_at)

    def header(self) -> str:
        """`API_CALL_HEADER`'s value: JSON, keys sorted (the same text on every read)."""
        return json.dumps({"api": self.api, "method": self.method, "path": self.path,
                           "body": self.body, "prepared_at": self.prepared_at.isoformat()},
                          sort_keys=True, separators=(",", ":"), default=str)

    @classmethod
    def from_header(cls, text: str) -> ApiRequest:
        """The request `header` wrote; `PermanentError` when `text` is not one."""
        try:
            raw = json.loads(text)
            return cls(str(raw["api"]), str(raw["method"]), str(raw["path"]), raw["body"],
                       datetime.fromisoformat(raw["prepared_at"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise PermanentError(f"{API_CALL_HEADER}: not a request ({exc})") from exc

    def content(self) -> bytes | None:
        """The body as sent: JSON, keys sorted, so every try sends the same bytes (a
        provider compares a repeated key's body)."""
        if self.body is None:
            return None
        return json.dumps(self.body, sort_keys=True, separators=(",", ":"),
                          default=str).encode()


def deadline_of(envelope: Envelope) -> datetime | None:
    """When `envelope`'s third-party request must no longer be sent (`API_DEADLINE_HEADER`),
    or None when it carries none (not such a follow-up) or it is unreadable."""
    return deadline_in(envelope.headers)


def deadline_in(headers: Mapping[str, str]) -> datetime | None:
    """`deadline_of` for a message's headers (a dead letter's, say)."""
    text = headers.get(API_DEADLINE_HEADER)
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _retry_after(result: ApiResult, policy: ApiPolicy, tried: int) -> float:
    if result.retry_after_s is not None:
        return min(max(result.retry_after_s, 0.0), policy.max_retry_after_s)
    return _backoff(policy, tried)


def _backoff(policy: ApiPolicy, tried: int) -> float:
    delays = policy.backoff_s or (0.0,)
    return delays[min(tried - 1, len(delays) - 1)]


class ApiCaller:
    """Sends follow-ups' third-party requests (see the module docstring) on `apis`, with
    the endpoint's `policies` by API name. `sleep` waits between tries (tests pass their
    own)."""

    def __init__(self, endpoint: str, apis: ThirdPartyApis | None,
                 policies: Mapping[str, ApiPolicy], clock: Clock, events: EventSink,
                 failpoints: Failpoints = NO_FAILPOINTS,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 tracer: Tracer = NULL_TRACER) -> None:
        """`tracer`: a `call <api>` span per send (kind client), with its answer's status."""
        self.endpoint, self.apis, self.policies = endpoint, apis, dict(policies)
        self.clock, self.events, self._fp, self._sleep = clock, events, failpoints, sleep
        self._tracer = tracer

    def deadline(self, request: ApiRequest) -> datetime:
        """When `request` must no longer be sent: its preparation plus the key retention.
        Raises `PermanentError` for an API this endpoint does not call."""
        return request.prepared_at + self._policy(request.api).key_retention

    def _policy(self, api: str) -> ApiPolicy:
        policy = self.policies.get(api)
        if policy is None:
            raise PermanentError(f"third-party API {api!r} is not configured for endpoint "
                                 f"{self.endpoint} (Registration.apis)")
        return policy

    async def _send(self, apis: ThirdPartyApis, request: ApiRequest, content: bytes | None,
                    key: str, tried: int) -> ApiResult:
        with self._tracer.span(f"call {request.api}", SpanKind.CLIENT, {
                "eo.api": request.api, "http.request.method": request.method,
                "url.path": request.path, "eo.idempotency_key": key, "eo.send": tried}) as span:
            result = await apis.send(request.api, request.method, request.path, content, key)
            span.set("http.response.status_code", result.status)
        return result

    async def _pause(self, policy: ApiPolicy, tried: int, seconds: float) -> None:
        """Wait before the next try (none after the last)."""
        if tried < policy.tries and seconds > 0:
            await self._sleep(seconds)

    async def call(self, stored: Envelope) -> HttpResponse:
        """Send the request of follow-up `stored` (its token's message) and return the
        answer its handler gets. Raises `WindowExpired` (never sent), `PermanentError` (422,
        an unconfigured API, no client), `TransientError` (still failing after the tries)."""
        header = stored.header(API_CALL_HEADER)
        if header is None:
            raise PermanentError(f"{stored.id_text}: not a third-party API follow-up")
        request = ApiRequest.from_header(header)
        policy = self._policy(request.api)
        deadline = self.deadline(request)
        committed = deadline_of(stored)  # the window the commit promised: never longer
        if committed is not None:
            deadline = min(deadline, committed)
        apis = self.apis
        if apis is None:
            raise PermanentError(f"third-party API {request.api!r}: no client is configured")
        key, content = stored.id_text, request.content()
        failure = "no try made"
        for tried in range(1, policy.tries + 1):
            if self.clock.now() >= deadline:
                raise WindowExpired(request.api, deadline)
            try:
                result = await self._send(apis, request, content, key, tried)
            except TransientError as exc:
                failure = str(exc)
                await self._pause(policy, tried, _backoff(policy, tried))
                continue
            self.events.emit(API_CALLED, endpoint=self.endpoint, message_id=key,
                             api=request.api, method=request.method, path=request.path,
                             status=result.status, send=tried)
            await self._fp.hit("after_api_call")
            status = result.status
            if status == 422:
                raise PermanentError(f"{request.api} answered 422 to {request.method} "
                                     f"{request.path}: the idempotency key {key} came back "
                                     "with another body")
            if status == 429:
                failure = f"{request.api} answered 429 (rate limited)"
                await self._pause(policy, tried, _retry_after(result, policy, tried))
                continue
            if status == 409 or status >= 500:
                failure = f"{request.api} answered {status}"
                await self._pause(policy, tried, _backoff(policy, tried))
                continue
            return HttpResponse(status=status, body=result.body)
        raise TransientError(f"{request.method} {request.path} on {request.api}: {failure} "
                             f"after {policy.tries} tries (the same key is sent again on "
                             "the next attempt)")

