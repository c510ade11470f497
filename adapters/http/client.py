"""`HttpRequests` over httpx: the caller's PUT/POST/DELETE of protocol 6 on real HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import httpx

from application.errors import PermanentError, RequestDeleted, TransientError
from application.http_caller import STORED_RESPONSE_HEADER
from application.ports import HttpRequests, HttpResult

#: How much of an unexpected answer's body goes into an error message (characters).
_BODY_EXCERPT = 500


class CalleeRefused(PermanentError):
    """The callee answered a status no retry can change (e.g. PUT 409 other body, 410
    deleted, 401, 413). `status` is the HTTP status, `body` the decoded JSON body."""

    def __init__(self, method: str, url: str, status: int, body: Mapping[str, Any]) -> None:
        excerpt = json.dumps(dict(body), default=str)[:_BODY_EXCERPT]
        super().__init__(f"{method} {url}: {status} {excerpt}")
        self.status, self.body = status, body


def json_body(response: httpx.Response) -> Mapping[str, Any]:
    """The answer's JSON object; anything else (a proxy's HTML page, a list) is wrapped so
    the caller still sees a mapping."""
    if not response.content:
        return {}
    try:
        body = response.json()
    except ValueError:  # not JSON (json.JSONDecodeError and UnicodeDecodeError both are)
        return {"text": response.text[:_BODY_EXCERPT]}
    return body if isinstance(body, dict) else {"value": body}


class HttpxRequests(HttpRequests):
    """The caller's side of protocol 6 on one shared `httpx.AsyncClient` (its timeouts and
    connection limits apply: see `http_client_resource`), for several callees.

    `credentials` maps each callee's base URL to its bearer token. A request goes only to a
    URL under one of those bases, with that callee's `Authorization: Bearer <token>`; any
    other URL raises `PermanentError` before anything is sent, so a credential never leaves
    for a URL a message named. Tokens are never logged nor put in an error message. Network
    errors and timeouts raise `TransientError`; a URL httpx cannot send (bad scheme) raises
    `PermanentError`.
    """

    def __init__(self, client: httpx.AsyncClient, credentials: Mapping[str, str]) -> None:
        self._client = client
        # longest base first: a base nested in another gets its own credential
        self._bases = sorted(((base.rstrip("/") + "/", {"Authorization": f"Bearer {token}"})
                              for base, token in credentials.items()),
                             key=lambda item: -len(item[0]))

    def __repr__(self) -> str:  # keep the tokens out of reprs and tracebacks' locals
        return f"HttpxRequests(bases={[base for base, _ in self._bases]}, tokens=<hidden>)"

    async def _send(self, method: str, url: str, body: bytes | None = None) -> httpx.Response:
        found = next((headers for base, headers in self._bases if url.startswith(base)), None)
        if found is None:
            raise PermanentError(f"{method} {url}: not under a configured callee's base URL")
        headers = dict(found)
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            return await self._client.request(method, url, content=body, headers=headers)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            # subclass (UnsupportedProtocol) of the request errors below, but no retry can fix them
            raise PermanentError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        except httpx.RequestError as exc:  # connect/read/write/pool timeouts included
            raise TransientError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc

    async def put(self, url: str, body: bytes) -> None:
        """Store `body` (JSON bytes) under `url`: 2xx returns; 5xx raises `TransientError`;
        410 raises `RequestDeleted` (a `Conflict`: the attempt lost); any other status raises
        `CalleeRefused` (a `PermanentError`)."""
        response = await self._send("PUT", url, body)
        if response.is_success:
            return
        if response.status_code >= 500:
            raise TransientError(f"PUT {url}: {response.status_code}")
        if response.status_code == 410:  # our unique URL, deleted by a winner's clean-up
            raise RequestDeleted(f"PUT {url}: 410, deleted by another attempt's clean-up")
        raise CalleeRefused("PUT", url, response.status_code, json_body(response))

    async def post(self, url: str) -> HttpResult:
        """Ask the callee to process the stored request: its answer as is (status, JSON
        body, `stored` when `EO-Stored-Response: true`); `collect_response` classifies it.
        Raises `TransientError` only for network errors and timeouts."""
        response = await self._send("POST", url)
        stored = response.headers.get(STORED_RESPONSE_HEADER) == "true"
        return HttpResult(response.status_code, json_body(response), stored)

    async def delete(self, url: str) -> None:
        """Delete the request and its response: 2xx and 404 return (already gone); 5xx
        raises `TransientError`; any other status raises `CalleeRefused`."""
        response = await self._send("DELETE", url)
        if response.is_success or response.status_code == 404:
            return
        if response.status_code >= 500:
            raise TransientError(f"DELETE {url}: {response.status_code}")
        raise CalleeRefused("DELETE", url, response.status_code, json_body(response))


async def http_client_resource(timeout_s: float = 10.0) -> AsyncGenerator[httpx.AsyncClient, None]:
    """dependency-injector `Resource`: one `httpx.AsyncClient` for every caller of the
    process, closed on shutdown. `timeout_s` (seconds) bounds reading, writing and waiting
    for a pooled connection; connecting gets at most 5 s of it. No redirects, no
    environment proxies: the callee URL is configured exactly."""
    timeout = httpx.Timeout(connect=min(timeout_s, 5.0), read=timeout_s, write=timeout_s,
                            pool=timeout_s)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=16,
                          keepalive_expiry=30.0)
    client = httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False,
                               trust_env=False)
    try:
        yield client
    finally:
        await client.aclose()
