"""The side effects' outside world: blobs (protocol 5), HTTP callees (6), third-party APIs
(12) and the renderer of documents into blob contents."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from domain.documents import Document


class BlobStore(Protocol):
    """Blobs (S3 objects or files). `put` overwrites, `delete` is idempotent."""

    async def put(self, key: str, content: bytes, media_type: str) -> None:
        """Store `content` under `key`."""

    async def delete(self, key: str) -> None:
        """Delete `key`; a missing key is a no-op."""

    async def exists(self, key: str) -> bool:
        """Whether `key` exists."""

    async def keys(self, prefix: str = "") -> list[str]:
        """All keys under `prefix`, sorted."""


@dataclass(frozen=True)
class HttpResult:
    """A callee's answer: status, JSON body and whether it is a stored business response
    (header `EO-Stored-Response: true`, protocol 6)."""

    status: int
    body: Mapping[str, Any]
    stored: bool


class HttpRequests(Protocol):
    """The caller's side of the HTTP protocol (protocol 6). Raises `TransientError` on network
    errors and 5xx; `put` raises `RequestDeleted` (a `Conflict`) on 410 (the attempt's own
    request was deleted by a winner's clean-up) and `PermanentError` on any other non-2xx
    (409 other body, 401, 413: the caller PUTs a fresh ID each attempt); `delete` accepts
    2xx and 404."""

    async def put(self, url: str, body: bytes) -> None:
        """Store the request body under `url` (create-only on the callee)."""

    async def post(self, url: str) -> HttpResult:
        """Ask the callee to process the stored request; returns its answer as is."""

    async def delete(self, url: str) -> None:
        """Delete the request and its response (idempotent on the callee)."""


@dataclass(frozen=True)
class ApiResult:
    """A third-party API's answer: HTTP `status`, JSON `body` (an object; anything else is
    wrapped), and its `Retry-After` in seconds when it sent one."""

    status: int
    body: Mapping[str, Any]
    retry_after_s: float | None = None


class ThirdPartyApis(Protocol):
    """The third-party HTTP APIs of protocol 12, by name: base URL and credential come from
    configuration, never from a message."""

    async def send(self, api: str, method: str, path: str, body: bytes | None,
                   idempotency_key: str) -> ApiResult:
        """Send `method` `path` (under `api`'s base URL) with JSON `body` and the header
        `Idempotency-Key: <idempotency_key>`; the answer as it came. Raises
        `TransientError` on a network error or a timeout, `PermanentError` for an API not
        configured."""


@dataclass(frozen=True)
class ApiPolicy:
    """How an endpoint calls one third-party API (protocol 12): the provider's
    `key_retention`, and `tries` sends per attempt, waiting `backoff_s[i]` seconds before
    try i + 2 (the last value repeats) or the provider's `Retry-After` (at most
    `max_retry_after_s`)."""

    key_retention: timedelta
    tries: int = 3
    backoff_s: tuple[float, ...] = (0.2, 1.0)
    max_retry_after_s: float = 30.0


class DocumentRenderer(Protocol):
    """Turns a handler's `Document` into bytes, deterministically (same document, same
    bytes), so a blob's content depends only on the decision."""

    media_type: str

    def render(self, document: Document) -> bytes:
        """The document's bytes (e.g. a PDF); raises ValueError for an unprintable one."""
