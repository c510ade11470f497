"""Preparing an attempt's side effects: register, create, re-check (protocol 3.2)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from application.api_caller import ApiCaller, ApiRequest
from application.codec import encode
from application.envelope import (
    API_CALL_HEADER,
    API_DEADLINE_HEADER,
    REQUEST_URL_HEADER,
    TOKEN_HEADER,
    Envelope,
    lineage,
)
from application.errors import Conflict, PermanentError
from application.failpoints import NO_FAILPOINTS, Failpoints
from application.outgoing_tokens import OutgoingTokens
from application.ports import (
    BlobStore,
    Clock,
    DocumentRenderer,
    HttpRequests,
    IdGenerator,
    PartitionStore,
    Tracer,
)
from application.ports.null_tracer import NULL_TRACER
from application.records import Kind, SideEffectRecord
from application.side_effects import MessagePayload, message_payload
from domain.decisions import CallApi, CallHttp, CreateBlob, Decision, Outgoing

if TYPE_CHECKING:
    import uuid
    from datetime import datetime


@dataclass(frozen=True)
class Prepared:
    """What the commit needs: the expected TR version after the registrations, the records
    the commit inserts itself, and the outgoing messages (for the processed-message row)."""

    version: int
    records: tuple[SideEffectRecord, ...]
    #: the outgoing messages' record payloads, by message ID (text)
    messages: tuple[tuple[str, Mapping[str, str]], ...]
    #: tokens the commit inserts itself (co-located fast path), else empty: (destination
    #: endpoint, envelope), each addressed to its destination
    tokens: tuple[tuple[str, Envelope], ...] = ()

    @property
    def outgoing(self) -> tuple[Mapping[str, str], ...]:
        """The outgoing messages as a processed-message row keeps them: each record
        payload with its `message_id`."""
        return tuple(MappingProxyType({**payload, "message_id": key})
                     for key, payload in self.messages)


class Preparation:
    """Turns a decision into registered records and created artifacts, in the handler's
    order: blobs, the HTTP request, then outgoing messages (the follow-up included).

    Raises `Conflict` when a registration or a re-check fails (the attempt must abort; its
    artifacts are deleted by the winner's clean-up or, after a failed re-check, here).
    """

    def __init__(
        self,
        endpoint: str,
        store: PartitionStore,
        outgoing: OutgoingTokens,
        clock: Clock,
        ids: IdGenerator,
        failpoints: Failpoints = NO_FAILPOINTS,
        blobs: BlobStore | None = None,
        http: HttpRequests | None = None,
        services: Mapping[str, str] | None = None,
        renderer: DocumentRenderer | None = None,
        token_receivers: frozenset[str] | None = None,
        tracer: Tracer = NULL_TRACER,
        api: ApiCaller | None = None,
    ) -> None:
        """`outgoing`: where outgoing messages' tokens are made (by the commit, or before
        it: application/outgoing_tokens.py); `services`: callee name -> base URL;
        `token_receivers`: the destinations that consume tokens (None: all). A message to
        any other destination (an outbox or state receiver, which deduplicates by message
        ID) gets no token and no token header: nobody would consume it. `tracer`: each
        outgoing message carries the current trace context (the attempt's span) in its
        headers, and each artifact's registration and creation is a span. `api`: the
        endpoint's third-party APIs (protocol 12), whose requests its follow-ups carry."""
        self._endpoint = endpoint
        self._store, self._outgoing, self._clock, self._ids = store, outgoing, clock, ids
        self._blobs, self._http, self._renderer = blobs, http, renderer
        self._services = dict(services or {})
        self._token_receivers = token_receivers
        self._fp = failpoints
        self._tracer = tracer
        self._api = api

    async def run(
        self,
        partition: str,
        version: int,
        incoming: Envelope,
        attempt: uuid.UUID,
        decision: Decision[Any],
    ) -> Prepared:
        """Register, create and re-check every artifact of `decision`; see the class doc."""
        seq = iter(range(1_000_000))
        now = self._clock.now()

        def record(
            kind: Kind, key: str, payload: Mapping[str, str] | None = None,
            in_token: bool = False,
        ) -> SideEffectRecord:
            kept = payload if isinstance(payload, MessagePayload) else MappingProxyType(
                dict(payload or {}))
            return SideEffectRecord(partition, kind, key, incoming.message_id, attempt,
                                    next(seq), kept, now, in_token)

        blobs = self._blobs
        for blob in decision.blobs:
            if blobs is None:
                raise PermanentError("the handler asked for a blob but no blob store is configured")
            content, media_type = self._content(blob)
            version = await self._artifact(
                record(Kind.BLOB, blob.key), version,
                create=partial(blobs.put, blob.key, content, media_type),
                delete=partial(blobs.delete, blob.key))
        outgoing = list(decision.outgoing)
        follow_up_headers: dict[str, str] = {}
        if decision.http_call is not None and decision.api_call is not None:
            raise PermanentError("a decision makes at most one call: http_call or api_call")
        if decision.http_call is not None:
            url, version = await self._http_request(record, version, decision.http_call)
            outgoing.append(Outgoing(self._endpoint, decision.http_call.follow_up))
            follow_up_headers[REQUEST_URL_HEADER] = url
        if decision.api_call is not None:  # nothing is sent: the committed follow-up will
            follow_up_headers.update(self._api_request(decision.api_call, now))
            outgoing.append(Outgoing(self._endpoint, decision.api_call.follow_up))
        payloads: list[tuple[str, Mapping[str, str]]] = []
        extra: list[SideEffectRecord] = []
        tokens: list[tuple[str, Envelope]] = []
        chain = lineage(incoming)
        if self._tracer is not NULL_TRACER:  # committed with the message: every copy has it
            chain.update(self._tracer.headers())
        for index, out in enumerate(outgoing):
            destination = out.destination
            tokened = self._token_receivers is None or destination in self._token_receivers
            headers = {TOKEN_HEADER: "1", **chain} if tokened else dict(chain)
            if follow_up_headers and index == len(outgoing) - 1:
                headers.update(follow_up_headers)
            envelope = Envelope(self._ids(), type(out.message).__name__, encode(out.message),
                                MappingProxyType(headers))
            payload, key = message_payload(destination, envelope), envelope.id_text
            payloads.append((key, payload))
            if tokened and self._outgoing.by_the_commit:
                # the token exists exactly when the commit does (3.2), and stands for the
                # record: the commit inserts the token only (`SideEffectRecord.in_token`)
                extra.append(record(Kind.MESSAGE, key, payload, True))
                tokens.append((destination, envelope))
                continue
            message_record = record(Kind.MESSAGE, key, payload)
            if not tokened:  # no artifact: the commit inserts the record, finish dispatches
                extra.append(message_record)
                continue
            version = await self._artifact(
                message_record, version,
                create=partial(self._outgoing.create, destination, envelope),
                delete=partial(self._outgoing.delete, destination, envelope.message_id))
        request_url = incoming.header(REQUEST_URL_HEADER)
        if request_url is not None:  # the follow-up's commit deletes it (protocol 6, step 3)
            extra.append(record(Kind.HTTP_DELETE, request_url))
        return Prepared(version, tuple(extra), tuple(payloads), tuple(tokens))

    def _api_request(self, call: CallApi, now: datetime) -> dict[str, str]:
        """The headers of a third-party API follow-up (protocol 12): its request, and when
        it must no longer be sent. Raises `PermanentError` for an API the endpoint does not
        call, a method or path it cannot send."""
        if self._api is None:
            raise PermanentError(f"the handler called the third-party API {call.api!r}, but "
                                 "the endpoint declares none (Registration.apis)")
        request = ApiRequest.of(call, now)
        return {API_CALL_HEADER: request.header(),
                API_DEADLINE_HEADER: self._api.deadline(request).isoformat()}

    def _content(self, blob: CreateBlob) -> tuple[bytes, str]:
        if isinstance(blob.content, bytes):
            return blob.content, blob.media_type
        renderer = self._renderer
        if renderer is None:
            raise PermanentError("the handler asked for a document but no renderer is configured")
        try:
            return renderer.render(blob.content), renderer.media_type
        except ValueError as exc:
            raise PermanentError(f"document for {blob.key} cannot be rendered: {exc}") from exc

    async def _http_request(
        self,
        record: Callable[[Kind, str], SideEffectRecord],
        version: int,
        call: CallHttp,
    ) -> tuple[str, int]:
        http = self._http
        base = self._services.get(call.service)
        if http is None or base is None:
            raise PermanentError(f"no HTTP callee configured for service {call.service!r}")
        url = f"{base.rstrip('/')}/requests/{self._ids()}"
        body = json.dumps(call.body, sort_keys=True, default=str).encode()

        async def put() -> None:
            await http.put(url, body)
            await self._fp.hit("after_put")

        version = await self._artifact(record(Kind.HTTP_REQUEST, url), version,
                                       create=put, delete=partial(http.delete, url))
        return url, version

    async def _artifact(
        self,
        rec: SideEffectRecord,
        version: int,
        create: Callable[[], Awaitable[None]],
        delete: Callable[[], Awaitable[None]],
    ) -> int:
        """register -> create -> re-check one artifact (in a span); returns the new expected
        version."""
        with self._tracer.span(f"create {rec.kind}", attributes={"eo.key": rec.key}):
            store, fp = self._store, self._fp
            version = await store.register(rec, version)
            await fp.hit(f"after_register:{rec.kind}")
            await create()
            await fp.hit(f"after_create:{rec.kind}")
            if not await store.registration_valid(rec):
                # another attempt committed and may have cleaned up already: our artifact would
                # be an orphan nobody deletes (protocol 3.2, step 3)
                await delete()
                raise Conflict(f"{rec.kind} {rec.key}: registration gone or transaction committed")
            return version
