"""An HTTP callee over HTTP (protocol 6): FastAPI routes onto `HttpCallee`, nothing more."""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Mapping
from typing import Annotated, Any, cast

import structlog
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import TypeAdapter
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from application.errors import PermanentError, TransientError
from application.http_callee import UNAVAILABLE, CalleeResponse, HttpCallee
from application.http_caller import STORED_RESPONSE_HEADER
from application.ports import PutResult

log = structlog.get_logger("eo.callee")


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
    if answer.internal is not None:
        log.warning("callee.unavailable", status=answer.status, reason=answer.internal)
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
_STORED = {STORED_RESPONSE_HEADER: {"description": "`true`: a stored business response, the "
                                    "same on every retry", "schema": {"type": "string",
                                                                      "enum": ["true"]}}}
#: Every refusal and protocol answer: `{"error": "<what is wrong>"}` (422s add `detail`).
_ERROR = {"type": "object", "required": ["error"],
          "properties": {"error": {"type": "string", "minLength": 1}}}
_PUT_RESULT = {"type": "object", "required": ["request_id", "result"], "properties": {
    "request_id": {"type": "string", "format": "uuid"},
    "result": {"type": "string", "enum": [str(r) for r in PutResult]}}}
_BUSINESS = {"type": "object", "description": "the handler's stored reply body"}


def _doc(description: str, schema: dict[str, Any] = _ERROR, stored: bool = False,
         ) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}},
            **({"headers": _STORED} if stored else {})}


_COMMON: dict[int | str, dict[str, Any]] = {
    401: _doc("missing or wrong bearer token (`WWW-Authenticate: Bearer`)"),
    405: _doc("method not allowed (`Allow` lists the resource's methods)"),
    413: _doc("body larger than the limit"),
    422: _doc("request ID not a UUID (validation detail)"),
    503: _doc("transient failure (e.g. store unreachable): retry; a request already "
              "processed is answered from its stored response"),
}


#: A decimal as text: pydantic's `Decimal` takes such a string (not "", NaN, or an exponent
#: beyond what the decimal module represents), the pattern keeps exponents to 4 digits.
_DECIMAL_TEXT = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d{1,4})?$"


def _request_schema(callee: HttpCallee) -> dict[str, Any]:
    """The JSON schema of the callee's request type (its message dataclass), so clients and
    generators see the body the PUT accepts; pydantic documents a `Decimal` as "number or
    any string", the string alternative gets the pattern it really must match."""
    cls = callee.request_class
    if cls is None:
        return {"type": "object"}
    schema: dict[str, Any] = TypeAdapter(cls).json_schema()
    for field in schema.get("properties", {}).values():
        alternatives = field.get("anyOf", [])
        if {"type": "number"} in alternatives:
            for alternative in alternatives:
                if alternative == {"type": "string"}:
                    alternative["pattern"] = _DECIMAL_TEXT
    return schema


def create_callee_app(callee: HttpCallee, token: str, max_body_bytes: int = 65536) -> FastAPI:
    """The callee routes of protocol 6 under `/requests/{request_id}` (PUT, POST, GET, DELETE)
    plus `/health`, answering what `callee` answers: its status, its JSON body, and
    `EO-Stored-Response: true` on stored responses. Every `/requests` route and the OpenAPI
    document (`/openapi.json`) require `Authorization: Bearer <token>` (else 401); bodies
    over `max_body_bytes` get 413; a 503 says "temporarily unavailable", never what failed
    inside (that is logged). Raises ValueError for an empty token."""
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
                                "content": {"application/json": {
                                    "schema": _request_schema(callee)}}}}

    @router.put("/{request_id}", status_code=201, openapi_extra=body_doc, responses={
        201: _doc("stored", _PUT_RESULT), 200: _doc("the same body was stored before",
                                                    _PUT_RESULT),
        409: _doc("another body is stored under this ID", _PUT_RESULT),
        410: _doc("deleted: a late PUT cannot bring it back", _PUT_RESULT),
        422: _doc("request ID not a UUID, or body not a valid request")})
    async def put_request(request_id: uuid.UUID, request: Request) -> Response:
        """Store a request, create-only."""
        return _answer(await callee.put(request_id, await request.body()))

    @router.post("/{request_id}", responses={
        200: _doc("the stored business response", _BUSINESS, stored=True),
        409: _doc("a stored business refusal", _BUSINESS, stored=True),
        404: _doc("unknown request (no stored-response header)"),
        422: _doc("request ID not a UUID, or the request was rejected")})
    async def post_request(request_id: uuid.UUID) -> Response:
        """Process the stored request once; answer its stored response on every retry."""
        return _answer(await callee.post(request_id))

    @router.get("/{request_id}", responses={
        200: _doc("the stored business response", _BUSINESS, stored=True),
        409: _doc("a stored business refusal", _BUSINESS, stored=True),
        404: _doc("no stored response")})
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
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(router)

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(authenticate)])
    async def openapi_document() -> JSONResponse:
        """The OpenAPI document, for callers holding the credential only."""
        return JSONResponse(app.openapi())

    @app.get("/health", tags=["status"])
    async def health() -> dict[str, str]:
        """200 while the process runs (no credential needed)."""
        return {"status": "ok"}

    async def refused(_request: Request, exc: Exception) -> Response:
        refusal = cast(_Refused, exc)  # registered for _Refused only
        return _refusal(refusal.status, refusal.error, refusal.headers)

    async def transient(request: Request, exc: Exception) -> Response:
        # HttpCallee lets store outages (and the `raise` failpoint) escape: still a 503 so
        # the caller retries, never a 500 traceback; what failed (hosts, SQL) stays in the log
        log.warning("callee.unavailable", path=request.url.path, reason=str(exc))
        return _refusal(503, str(UNAVAILABLE["error"]))

    async def permanent(_request: Request, exc: Exception) -> Response:
        # data no retry can store (e.g. refused by the database): the client's to fix
        return _refusal(422, cast(PermanentError, exc).reason)

    async def http_error(request: Request, exc: Exception) -> Response:
        error = cast(HTTPException, exc)  # registered for HTTPException only
        headers = dict(error.headers or {})
        if error.status_code == 405:
            # Starlette answers with the methods of the first route matching the path only;
            # a client must see every method the resource has (RFC 9110, 15.5.6)
            path = request.url.path
            routes = [*router.routes, *app.routes]  # the router's are not in app.routes
            allowed = sorted({method for route in routes if isinstance(route, APIRoute)
                              and route.path_regex.match(path) for method in route.methods or ()})
            headers["Allow"] = ", ".join(allowed)
        return _refusal(error.status_code, str(error.detail), headers or None)

    async def invalid(_request: Request, exc: Exception) -> Response:
        errors = cast(RequestValidationError, exc).errors()
        where = ".".join(str(p) for p in errors[0].get("loc", ())) if errors else "request"
        message = errors[0].get("msg", "invalid") if errors else "invalid request"
        return JSONResponse({"error": f"{where}: {message}",
                             "detail": jsonable_encoder(errors)}, status_code=422)

    app.add_exception_handler(_Refused, refused)
    app.add_exception_handler(TransientError, transient)
    app.add_exception_handler(PermanentError, permanent)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_middleware(_BodyLimit, max_bytes=max_body_bytes)
    return app
