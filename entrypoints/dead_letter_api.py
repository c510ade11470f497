"""The dead letters over HTTP for operators (`eo dead-letters serve`): list, show, replay and
discard (application/dead_letters.py), each request authenticated by a bearer token that names
its operator (`EO_OPERATOR_TOKENS`), so every action is logged with who did it."""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations, and the
# operator dependency is local to `create_dead_letter_app`

import secrets
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from application.dead_letters import MAX_WHY_CHARS, ActionResult, DeadLetters
from application.ports import DeadLetterQuery
from entrypoints.dead_letter_views import (
    MAX_AGE_S,
    MAX_DEAD_LETTER_ID,
    MAX_LIMIT,
    age,
    letter_json,
    query_of,
    result_json,
)

#: the most validation errors a 422 lists (the others are counted)
MAX_ERRORS_SHOWN = 10


#: a dead letter's ID in a path, and in a filter's `ids`
_PathId = Annotated[int, Path(ge=1, le=MAX_DEAD_LETTER_ID, description="a dead letter's ID")]
_Id = Annotated[int, Field(ge=1, le=MAX_DEAD_LETTER_ID)]


class _Filter(BaseModel):
    """Which dead letters a bulk action takes (ages in seconds, finite, at most
    `MAX_AGE_S`); `all` must be true, so an empty filter never acts on everything by
    accident."""

    endpoints: list[str] = Field(default_factory=list)
    ids: list[_Id] = Field(default_factory=list)
    reason: str | None = None
    older_than_s: float | None = Field(None, ge=0, le=MAX_AGE_S, allow_inf_nan=False)
    newer_than_s: float | None = Field(None, ge=0, le=MAX_AGE_S, allow_inf_nan=False)
    limit: int = Field(100, ge=1, le=MAX_LIMIT)
    all: bool = False

    def query(self) -> DeadLetterQuery:
        return query_of(self.endpoints, self.ids, "dead", self.reason,
                        age(self.older_than_s, "older_than_s"),
                        age(self.newer_than_s, "newer_than_s"), self.limit)


class _Discard(BaseModel):
    why: str = Field(min_length=1, max_length=MAX_WHY_CHARS)


class _DiscardMany(_Filter):
    why: str = Field(min_length=1, max_length=MAX_WHY_CHARS)


_BEARER = HTTPBearer(auto_error=False, scheme_name="bearer",
                     description="an operator's token (EO_OPERATOR_TOKENS)")


def operator_auth(tokens: Mapping[str, str]) -> Callable[..., str]:
    """A FastAPI dependency: the name of the operator whose bearer token the request carries
    (`tokens`: name -> token, at least one, each non-empty: ValueError otherwise); 401 for a
    missing or unknown token (compared in constant time)."""
    if not tokens or not all(tokens.values()):
        raise ValueError("the operators' API needs at least one operator token")

    def operator(credentials: Annotated[HTTPAuthorizationCredentials | None,
                                        Depends(_BEARER)]) -> str:
        given = credentials.credentials if credentials is not None else ""
        for name, token in tokens.items():
            if secrets.compare_digest(given.encode(), token.encode()):
                return name
        raise HTTPException(401, "missing or unknown operator token",
                            headers={"WWW-Authenticate": "Bearer"})

    return operator


async def invalid_request(_request: Request, exc: Exception) -> JSONResponse:
    """The 422 of a request that fails validation: `{"error": "<where>: <what>" (and how many
    more), "detail": [{"loc", "msg", "type"}, ...]}` (at most `MAX_ERRORS_SHOWN`). Never the
    input: FastAPI's default echoes it back whole (a 5 MB `why` came back in the answer);
    each location part and message is clipped to 200 characters."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    shown: list[dict[str, Any]] = [
        {"loc": [p if isinstance(p, int) else _clip(str(p)) for p in e.get("loc", ())],
         "msg": _clip(str(e.get("msg", "invalid"))), "type": str(e.get("type", ""))}
        for e in errors[:MAX_ERRORS_SHOWN]]
    error = "invalid request"
    if shown:
        error = ".".join(str(p) for p in shown[0]["loc"]) + ": " + str(shown[0]["msg"])
    if len(errors) > 1:
        error += f" (and {len(errors) - 1} more)"
    return JSONResponse({"error": error, "detail": shown}, status_code=422)


def _clip(text: str, most: int = 200) -> str:
    return text if len(text) <= most else text[:most] + "..."


#: Headers on every response of the operators' servers: no page may frame them (the page's
#: buttons act on dead letters), no MIME sniffing, no Referer leaving them; a Content-Security-
#: Policy that loads nothing (JSON needs nothing; the page sets its own, operator_page.py).
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; "
                               "form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class SecurityHeaders:
    """ASGI middleware: `SECURITY_HEADERS` on every HTTP response of the app it wraps; a
    header the response sets itself (the page's own Content-Security-Policy) is kept.
    Starlette's 500 for an unhandled exception is sent outside the app's middleware, so
    without them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, sending)


def new_operator_app(title: str, description: str, operator: Callable[..., str]) -> FastAPI:
    """An empty FastAPI app as both operators' servers make theirs (this API and the
    operator's page): no Swagger UI or ReDoc (they load their scripts from a CDN), the
    OpenAPI document at `/openapi.json` for a known token only (`operator`, from
    `operator_auth`: 401 otherwise; under a mount it names the mount's path as its server),
    `invalid_request` for the 422s, and `SECURITY_HEADERS` on every response."""
    app = FastAPI(title=title, description=description, docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(operator)])
    async def openapi_document(request: Request) -> JSONResponse:
        document = app.openapi()
        root = str(request.scope.get("root_path", "")).rstrip("/")
        return JSONResponse({**document, "servers": [{"url": root}]} if root else document)

    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_middleware(SecurityHeaders)
    return app


def create_dead_letter_app(operations: DeadLetters, tokens: Mapping[str, str]) -> FastAPI:
    """The API on `operations`; `tokens` maps each operator's name to its bearer token (at
    least one, each non-empty: ValueError otherwise). Every route answers 401 without a
    known token, the OpenAPI document (`/openapi.json`) too (`new_operator_app`); a refused
    action answers 409 with the reason, invalid input 400 or 422 with `{"error": ...}`
    naming the field and the limit (`invalid_request`)."""
    operator = operator_auth(tokens)
    Operator = Annotated[str, Depends(operator)]
    app = new_operator_app("Dead letters", __doc__ or "", operator)

    @app.exception_handler(ValueError)
    async def _bad_request(_request: Any, exc: ValueError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=400)

    @app.get("/dead-letters")
    async def list_letters(
        _by: Operator, endpoint: Annotated[list[str] | None, Query()] = None,
        status: str = "dead", reason: str | None = None,
        older_than_s: Annotated[float | None, Query(ge=0, le=MAX_AGE_S,
                                                    allow_inf_nan=False)] = None,
        newer_than_s: Annotated[float | None, Query(ge=0, le=MAX_AGE_S,
                                                    allow_inf_nan=False)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    ) -> list[dict[str, Any]]:
        """The dead letters the filters select, oldest first (bodies included)."""
        found = await operations.find(query_of(endpoint, None, status, reason,
                                               age(older_than_s, "older_than_s"),
                                               age(newer_than_s, "newer_than_s"), limit))
        return [letter_json(d) for d in found]

    @app.get("/dead-letters/{dead_letter_id}")
    async def show(dead_letter_id: _PathId, _by: Operator) -> dict[str, Any]:
        """One dead letter, with whether its message's token still exists."""
        found = await operations.find(DeadLetterQuery(ids=(dead_letter_id,), status=None,
                                                      limit=1))
        if not found:
            raise HTTPException(404, f"no dead letter {dead_letter_id}")
        return letter_json(found[0], await operations.token_exists(found[0]))

    @app.post("/dead-letters/{dead_letter_id}/replay")
    async def replay(dead_letter_id: _PathId, by: Operator) -> JSONResponse:
        """Republish it to its endpoint (409 with the reason when refused)."""
        return _answer(await operations.replay(dead_letter_id, by))

    @app.post("/dead-letters/{dead_letter_id}/discard")
    async def discard(dead_letter_id: _PathId, body: _Discard, by: Operator) -> JSONResponse:
        """Release what its message holds and discard it, for `why`."""
        return _answer(await operations.discard(dead_letter_id, by, body.why))

    @app.post("/dead-letters/replay")
    async def replay_many(body: _Filter, by: Operator) -> list[dict[str, Any]]:
        """Replay each dead letter the filter selects (`all` must be true)."""
        _needs_all(body)
        return [result_json(r) for r in await operations.replay_many(body.query(), by)]

    @app.post("/dead-letters/discard")
    async def discard_many(body: _DiscardMany, by: Operator) -> list[dict[str, Any]]:
        """Discard each dead letter the filter selects, for `why` (`all` must be true)."""
        _needs_all(body)
        return [result_json(r) for r in
                await operations.discard_many(body.query(), by, body.why)]

    return app


def _needs_all(body: _Filter) -> None:
    if not body.all:
        raise ValueError("a bulk action needs \"all\": true (with the filters that select "
                         "the dead letters)")


def _answer(result: ActionResult) -> JSONResponse:
    return JSONResponse(result_json(result), status_code=200 if result.done else 409)
