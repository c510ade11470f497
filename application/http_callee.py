"""The callee's half of HTTP request/response (protocol 6), independent of any HTTP server."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from application.envelope import TOKEN_HEADER, Envelope
from application.errors import PermanentError, TransientError
from application.failpoints import NO_FAILPOINTS, Failpoints
from application.observability import ATTEMPT_ABANDONED
from application.ports import Clock, PutResult, RequestStore, StoredReplies
from application.processor import Processor

_PUT_STATUS = {PutResult.CREATED: 201, PutResult.SAME: 200, PutResult.DIFFERENT: 409,
               PutResult.GONE: 410}


@dataclass(frozen=True)
class CalleeResponse:
    """What the HTTP layer sends: status, JSON body, and whether it is a stored business
    response (then the header `EO-Stored-Response: true` goes with it). `internal` says
    what failed inside, for the log only: a response never tells a client (hosts, SQL)."""

    status: int
    body: Mapping[str, Any]
    stored: bool = False
    internal: str | None = None


#: The body of every 503: retry later, nothing more.
UNAVAILABLE: Mapping[str, Any] = {"error": "temporarily unavailable: retry"}


class HttpCallee:
    """PUT/POST/GET/DELETE of `/requests/{id}` for one callee endpoint.

    POST runs the stored request through the same `Processor` as a message (incoming ID =
    request ID, token = "stored and not yet answered"); the commit stores the response and
    marking the request answered is the consume step. `request_type` names the message type
    the stored body decodes to. `failpoints` is the scoped view (`callee.` names). Every
    protocol outcome is a `CalleeResponse`; `TransientError` escapes only when a store is
    unreachable (the HTTP app answers 503).
    """

    def __init__(
        self,
        processor: Processor,
        requests: RequestStore,
        replies: StoredReplies,
        clock: Clock,
        request_type: str,
        failpoints: Failpoints = NO_FAILPOINTS,
    ) -> None:
        self.processor = processor
        self.requests = requests
        self.replies = replies
        self.clock = clock
        self.request_type = request_type
        self._fp = failpoints

    @property
    def endpoint(self) -> str:
        """The callee endpoint's name."""
        return self.processor.endpoint

    @property
    def request_class(self) -> type | None:
        """The dataclass a stored request's body decodes to (None: not registered)."""
        return self.processor.runner.endpoint.messages.get(self.request_type)

    def _envelope(self, request_id: uuid.UUID, body: bytes) -> Envelope:
        return Envelope(request_id, self.request_type, body, MappingProxyType({TOKEN_HEADER: "1"}))

    async def put(self, request_id: uuid.UUID, body: bytes) -> CalleeResponse:
        """Store a request create-only: 201 new, 200 same body, 409 other body, 410 deleted,
        422 when the body is not a valid request."""
        envelope = self._envelope(request_id, body)
        try:
            self.processor.decode(envelope)
        except PermanentError as exc:
            return CalleeResponse(422, {"error": exc.reason})
        result = await self.requests.put(request_id, envelope)
        return CalleeResponse(_PUT_STATUS[result], {"request_id": str(request_id),
                                                    "result": str(result)})

    async def post(self, request_id: uuid.UUID) -> CalleeResponse:
        """Process the request once and answer its stored response (same on every retry);
        404 unknown, 503 on a transient failure (nothing committed), 422 when rejected."""
        # a request still unanswered may have a committed, unfinished transaction: processing
        # finishes it first (publication, then "answered"), then the stored reply is read
        stored = await self.requests.get(request_id)
        if stored is not None:
            try:
                await self.processor.process(stored)
            except PermanentError as exc:
                return CalleeResponse(422, {"error": exc.reason})
            except TransientError as exc:
                # the attempt ends here, uncommitted: the caller retries on the 503. Said with
                # the request's ID, as a consumer's failed attempt is by its retry
                self.processor.events.emit(
                    ATTEMPT_ABANDONED, endpoint=self.processor.endpoint,
                    message_id=str(request_id), reason=f"answered 503: {exc}")
                return CalleeResponse(503, UNAVAILABLE, internal=str(exc))
        reply = await self.replies.stored_reply(request_id)
        if reply is None:
            return CalleeResponse(404, {"error": f"unknown request {request_id}"})
        try:
            await self._fp.hit("before_reply")
        except TransientError as exc:  # the reply is lost: the caller retries
            return CalleeResponse(503, UNAVAILABLE, internal=str(exc))
        return CalleeResponse(reply.status, reply.body, stored=True)

    async def get(self, request_id: uuid.UUID) -> CalleeResponse:
        """The stored response, or 404."""
        reply = await self.replies.stored_reply(request_id)
        if reply is None:
            return CalleeResponse(404, {"error": f"no response for {request_id}"})
        return CalleeResponse(reply.status, reply.body, stored=True)

    async def delete(self, request_id: uuid.UUID) -> CalleeResponse:
        """Remove request and response, keep a tombstone (also for an unknown ID): 204."""
        await self.requests.remove(request_id, self.clock.now())
        await self.replies.delete_reply(request_id)
        return CalleeResponse(204, {})
