"""What a pure handler returns: the new state, outgoing messages and requested side effects."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from domain.documents import Document

S = TypeVar("S")


@dataclass(frozen=True)
class Outgoing:
    """An outgoing message: `message` (a frozen dataclass registered with the endpoint's
    catalogue) sent to the queue of the endpoint named `destination`.

    Its message ID is not chosen here: the processor gives it one per attempt (protocol 3.3).
    """

    destination: str
    message: Any


@dataclass(frozen=True)
class CreateBlob:
    """Request a blob (an object in the blob store) made during the attempt.

    `key` must come from `Context.artifact_key(prefix, n)`, so it is unique to the attempt
    (protocol 3.2: never a fixed name). `content` is the object's bytes, or a `Document` the
    application renders (as PDF) before storing; `media_type` is the bytes' type (a rendered
    document gets the renderer's).
    """

    key: str
    content: bytes | Document
    media_type: str = "application/octet-stream"


@dataclass(frozen=True)
class CallHttp:
    """Request an exactly-once HTTP call (protocol 6).

    `service` names the callee (resolved to a base URL by configuration), `body` is the JSON
    request body, `follow_up` the message sent to this endpoint's own queue that will carry
    the callee's stored response back into a handler (through `Context.http_response`).
    """

    service: str
    body: Mapping[str, Any]
    follow_up: Any


@dataclass(frozen=True)
class CallApi:
    """Request a call to a third-party HTTP API, exactly once as far as the API honours its
    `Idempotency-Key` header (protocol 12).

    `api` names the API as the registry declares it (its base URL, credential and key
    retention come from settings), `method` is the HTTP method, `path` the path under the
    base URL (starting with "/": a message never names a host), `body` the JSON request body
    (None: none), `follow_up` the message sent to this endpoint's own queue that makes the
    call and carries the answer back into a handler (through `Context.http_response`).
    Nothing is sent before the commit: the request travels in the committed follow-up.
    """

    api: str
    method: str
    path: str
    body: Mapping[str, Any] | None
    follow_up: Any


@dataclass(frozen=True)
class Reply:
    """The business response of an HTTP callee's handler: status code and JSON body.

    Stored by the commit transaction and returned on every retry (protocol 6, callee).
    """

    status: int
    body: Mapping[str, Any]


@dataclass(frozen=True)
class Decision(Generic[S]):
    """A handler's result: everything the processor needs to make the effect durable.

    - `state`: the partition's new business state (return the old one when unchanged).
    - `outgoing`: messages to publish after commit, in order.
    - `blobs`: blobs created during the attempt, published by their keys travelling in messages.
    - `http_call`: at most one exactly-once HTTP call to a callee (protocol 6).
    - `api_call`: at most one call to a third-party API (protocol 12).
    - `reply`: for an HTTP callee, the stored business response.
    """

    state: S
    outgoing: tuple[Outgoing, ...] = ()
    blobs: tuple[CreateBlob, ...] = ()
    http_call: CallHttp | None = None
    reply: Reply | None = None
    api_call: CallApi | None = None


@dataclass(frozen=True)
class Endpoint(Generic[S]):
    """A pure endpoint definition: the messages it accepts and how it handles them.

    - `messages`: message type name -> frozen dataclass of its body.
    - `partition_of(message) -> str`: the partition key (unit of atomic update).
    - `handle(state | None, message, context) -> Decision`: deterministic; `state` is None for
      a partition never written.
    - `state_type`: the dataclass of the state, so adapters can store and restore it.
    """

    name: str
    messages: Mapping[str, type]
    partition_of: Callable[[Any], str]
    handle: Callable[[S | None, Any, Any], Decision[S]]
    state_type: type[S]
    outputs: tuple[str, ...] = field(default=())

    def type_name(self, message: object) -> str:
        """The registered type name of `message`; raises KeyError when it is not registered."""
        for name, cls in self.messages.items():
            if type(message) is cls:
                return name
        raise KeyError(type(message).__name__)
