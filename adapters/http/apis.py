"""`ThirdPartyApis` over httpx: the requests of protocol 12 sent to third-party HTTP APIs with
their `Idempotency-Key`, on the process's shared client."""

from __future__ import annotations

import email.utils
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from adapters.http.client import json_body
from application.errors import PermanentError, TransientError
from application.ports import ApiResult, ThirdPartyApis

#: The header a provider reads the key from (draft-ietf-httpapi-idempotency-key-header).
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"


@dataclass(frozen=True)
class ApiEndpoint:
    """Where one API answers: its base URL, its bearer token (None: none sent) and one
    request's timeout in seconds."""

    base_url: str
    token: str | None
    timeout_s: float

    def __repr__(self) -> str:  # the token stays out of reprs and tracebacks' locals
        return f"ApiEndpoint({self.base_url!r}, token=<hidden>, timeout_s={self.timeout_s})"


def retry_after_s(value: str | None, now: datetime | None = None) -> float | None:
    """A `Retry-After` header's wait in seconds (delta-seconds or an HTTP date), None when
    absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


class HttpxApis(ThirdPartyApis):
    """The third-party APIs `endpoints` (by name) on one `httpx.AsyncClient`. A request goes
    to its API's base URL joined with the request's path, never elsewhere, with
    `Authorization: Bearer <token>` when the API has one; tokens are never logged nor put in
    an error. The API's timeout bounds each request."""

    def __init__(self, client: httpx.AsyncClient, endpoints: Mapping[str, ApiEndpoint]) -> None:
        self._client, self._endpoints = client, dict(endpoints)

    def __repr__(self) -> str:
        return f"HttpxApis({sorted(self._endpoints)})"

    async def send(self, api: str, method: str, path: str, body: bytes | None,
                   idempotency_key: str) -> ApiResult:
        endpoint = self._endpoints.get(api)
        if endpoint is None:
            raise PermanentError(f"third-party API {api!r} is not configured "
                                 f"(EO_APIS__{api.upper()}__URL)")
        url = endpoint.base_url.rstrip("/") + path
        headers = {IDEMPOTENCY_KEY_HEADER: idempotency_key, "Accept": "application/json"}
        if endpoint.token is not None:
            headers["Authorization"] = f"Bearer {endpoint.token}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            response = await self._client.request(method, url, content=body, headers=headers,
                                                   timeout=endpoint.timeout_s)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise PermanentError(f"{method} {api}{path}: {type(exc).__name__}: {exc}") from exc
        except httpx.RequestError as exc:  # connect, read, write and pool timeouts included
            raise TransientError(f"{method} {api}{path}: {type(exc).__name__}: {exc}") from exc
        return ApiResult(response.status_code, json_body(response),
                         retry_after_s(response.headers.get("Retry-After")))
