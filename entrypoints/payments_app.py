"""The payments callee over HTTP (protocol 6): FastAPI routes onto `HttpCallee`, nothing more."""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Mapping
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from application.errors import TransientError
from application.http_callee import CalleeResponse, HttpCallee
from application.http_caller import STORED_RESPONSE_HEADER


class _Refused(Exception):
    """A protocol answer raised from a dependency or the body stream: `status`, `error`."""

    def __init__(self, status: int, error: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(error)
        self.status, self.error, self.headers = status, error, headers


def _refusal(status: int, error: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error}, status_code=status, headers=headers)


class _BodyLimit:
    """ASGI middleware: 413 before anything is read when Content-Length exceeds `max_bytes`,
    and while streaming as soon as the received bytes do (chunked bodies)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await _refusal(413, f"body larger than {self.max_bytes} bytes")(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise _Refused(413, f"body larger than {self.max_bytes} bytes")
            return message

        await self.app(scope, limited, send)


def _json(value: Any) -> Any:
    # stored bodies may hold Decimals (money) or read-only mappings: strings, never floats
    return dict(value) if isinstance(value, Mapping) else str(value)


def _answer(answer: CalleeResponse) -> Response:
    headers = {STORED_RESPONSE_HEADER: "true"} if answer.stored else None
    if answer.status == 204:
        return Response(status_code=204, headers=headers)
    content = json.dumps(dict(answer.body), default=_json, separators=(",", ":"))
    return Response(content, status_code=answer.status, headers=headers,
                    media_type="application/json")


# module level: FastAPI resolves the (postponed) annotation in the module's namespace
_BEARER = HTTPBearer(auto_error=False, scheme_name="bearer",
                     description="the token the callee is configured with")
_Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]
_OBJECT = {"application/json": {"schema": {"type": "object"}}}
_STORED = {STORED_RESPONSE_HEADER: {"description": "`true`: a stored business response, the "
                                    "same on every retry", "schema": {"type": "string",
                                                                      "enum": ["true"]}}}


def _doc(description: str, stored: bool = False) -> dict[str, Any]:
    return {"description": description, "content": _OBJECT, **({"headers": _STORED} if stored
                                                              else {})}


_COMMON: dict[int | str, dict[str, Any]] = {
    401: _doc("missing or wrong bearer token (`WWW-Authenticate: Bearer`)"),
    413: _doc("body larger than the limit"),
    422: _doc("request ID not a UUID (validation detail)"),
    503: _doc("transient failure (e.g. store unreachable): retry; a request already "
              "processed is answered from its stored response"),
}


def create_payments_app(callee: HttpCallee, token: str, max_body_bytes: int = 65536) -> FastAPI:
    """The callee routes of protocol 6 under `/requests/{request_id}` (PUT, POST, GET, DELETE)
    plus `/health`, answering what `callee` answers: its status, its JSON body, and
    `EO-Stored-Response: true` on stored responses. Every `/requests` route requires
    `Authorization: Bearer <token>` (else 401); bodies over `max_body_bytes` get 413.
    Raises ValueError for an empty token."""
    if not token:
        raise ValueError("the callee needs a non-empty bearer token")
    expected = token.encode()

    async def authenticate(credentials: _Credentials) -> None:
        given = credentials.credentials.encode() if credentials else b""
        if not secrets.compare_digest(given, expected):
            raise _Refused(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})

    router = APIRouter(prefix="/requests", tags=["requests"],
                       dependencies=[Depends(authenticate)], responses=_COMMON)
    body_doc = {"requestBody": {"required": True, "description": f"a {callee.request_type}",
                                "content": _OBJECT}}

    @router.put("/{request_id}", status_code=201, openapi_extra=body_doc, responses={
        201: _doc("stored"), 200: _doc("the same body was stored before"),
        409: _doc("another body is stored under this ID"),
        410: _doc("deleted: a late PUT cannot bring it back"),
        422: _doc("request ID not a UUID, or body not a valid request")})
    async def put_request(request_id: uuid.UUID, request: Request) -> Response:
        """Store a request, create-only."""
        return _answer(await callee.put(request_id, await request.body()))

    @router.post("/{request_id}", responses={
        200: _doc("the stored business response (any status, e.g. 409 refused)", stored=True),
        409: _doc("a stored business refusal", stored=True),
        404: _doc("unknown request (no stored-response header)"),
        422: _doc("request ID not a UUID, or the request was rejected")})
    async def post_request(request_id: uuid.UUID) -> Response:
        """Process the stored request once; answer its stored response on every retry."""
        return _answer(await callee.post(request_id))

    @router.get("/{request_id}", responses={
        200: _doc("the stored business response", stored=True),
        409: _doc("a stored business refusal", stored=True), 404: _doc("no stored response")})
    async def get_request(request_id: uuid.UUID) -> Response:
        """The stored response of a request."""
        return _answer(await callee.get(request_id))

    @router.delete("/{request_id}", status_code=204, response_class=Response,
                   responses={204: {"description": "deleted, tombstone kept (idempotent)"}})
    async def delete_request(request_id: uuid.UUID) -> Response:
        """Delete a request and its response; a late PUT of its ID gets 410."""
        return _answer(await callee.delete(request_id))

    app = FastAPI(title=f"{callee.request_type} callee", version="1",
                  description="Exactly-once HTTP request/response, callee side (protocol 6).",
                  docs_url=None, redoc_url=None)
    app.include_router(router)

    @app.get("/health", tags=["status"])
    async def health() -> dict[str, str]:
        """200 while the process runs (no credential needed)."""
        return {"status": "ok"}

    async def refused(_request: Request, exc: Exception) -> Response:
        refusal = cast(_Refused, exc)  # registered for _Refused only
        return _refusal(refusal.status, refusal.error, refusal.headers)

    async def transient(_request: Request, exc: Exception) -> Response:
        # HttpCallee lets store outages (and the `raise` failpoint) escape: still a 503 so
        # the caller retries, never a 500 traceback
        return _refusal(503, str(exc))

    app.add_exception_handler(_Refused, refused)
    app.add_exception_handler(TransientError, transient)
    app.add_middleware(_BodyLimit, max_bytes=max_body_bytes)
    return app
