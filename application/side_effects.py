"""Side-effect kinds (protocol 5): how each is published after commit and cleaned when aborted."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pydantic_core import from_json, to_json

from application.envelope import Envelope
from application.failpoints import NO_FAILPOINTS, Failpoints
from application.ports import BlobStore, HttpRequests, MessageDispatcher, TokenStore
from application.records import Kind


class MessagePayload(Mapping[str, str]):
    """The side-effect record payload of an outgoing message (`message_payload`): its
    `destination`, and its `type`, `body` (UTF-8 text) and `headers` (JSON text), formatted
    only when read (a record that its token stands for is never stored as a row), while
    `from_message_payload` takes the envelope back without parsing them."""

    __slots__ = ("_text", "destination", "envelope")

    def __init__(self, destination: str, envelope: Envelope) -> None:
        self.destination, self.envelope = destination, envelope
        self._text: dict[str, str] | None = None

    def _items(self) -> dict[str, str]:
        text = self._text
        if text is None:
            envelope = self.envelope
            text = self._text = {
                "destination": self.destination,
                "type": envelope.type,
                "body": envelope.body.decode(),
                "headers": to_json(dict(sorted(envelope.headers.items()))).decode(),
            }
        return text

    def __getitem__(self, name: str) -> str:
        return self.destination if name == "destination" else self._items()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return 4

    def __repr__(self) -> str:
        return f"MessagePayload({self._items()!r})"


def message_payload(destination: str, envelope: Envelope) -> Mapping[str, str]:
    """The side-effect record payload of an outgoing message: all that dispatch needs
    (`MessagePayload`)."""
    return MessagePayload(destination, envelope)


def from_message_payload(key: str, payload: Mapping[str, str]) -> tuple[str, Envelope]:
    """Inverse of `message_payload`: (destination, envelope) of a message record whose
    payload is `payload` (a `MessagePayload`, or the mapping a store read back)."""
    if isinstance(payload, MessagePayload):
        return payload.destination, payload.envelope
    return payload["destination"], Envelope(
        message_id=uuid.UUID(key),
        type=payload["type"],
        body=payload["body"].encode(),
        headers=MappingProxyType(from_json(payload["headers"])),
    )


#: The kinds whose publication does something: a message is dispatched, a stored HTTP
#: request deleted; a blob's key travels in messages and a stored request is named by the
#: follow-up, so theirs does nothing.
PUBLISHED_KINDS = frozenset({Kind.MESSAGE, Kind.HTTP_DELETE})


@dataclass
class SideEffects:
    """Publication and clean-up of every kind; each operation is idempotent, so a crashed
    `finish` is repaired by running it again (protocol 3.1)."""

    tokens: TokenStore
    dispatcher: MessageDispatcher
    blobs: BlobStore | None
    http: HttpRequests | None
    failpoints: Failpoints = NO_FAILPOINTS

    async def publish(self, kind: Kind, key: str, payload: Mapping[str, str]) -> bool:
        """Make a committed side effect visible. Returns False for kinds with nothing to
        publish (a blob's key travels in messages; a stored HTTP request is named by the
        follow-up message)."""
        if kind not in PUBLISHED_KINDS:
            return False
        if kind is Kind.MESSAGE:
            destination, envelope = from_message_payload(key, payload)
            await self.dispatcher.dispatch(destination, envelope)
            return True
        await self._http_delete(key)  # Kind.HTTP_DELETE
        return True

    async def clean_up(self, kind: Kind, key: str, payload: Mapping[str, str]) -> None:
        """Delete the artifact of an aborted attempt (a no-op when it was never created):
        `key` and `payload` are its side-effect record's (a message's token is addressed to
        the payload's `destination`)."""
        if kind is Kind.MESSAGE:
            await self.tokens.delete(payload["destination"], uuid.UUID(key))
        elif kind is Kind.BLOB:
            if self.blobs is not None:
                await self.blobs.delete(key)
        elif kind is Kind.HTTP_REQUEST:
            await self._http_delete(key)

    async def present(self, kind: Kind, key: str, payload: Mapping[str, str]) -> bool | None:
        """Whether the artifact of a record still exists: a blob (its key), a message (its
        token, addressed to the payload's `destination`); None for an HTTP request (the
        protocol has no question for it that would not touch it) and kinds without an
        artifact. For `eo inspect`: a deferred clean-up whose artifact is gone has nothing
        left to do."""
        if kind is Kind.BLOB:
            return None if self.blobs is None else await self.blobs.exists(key)
        if kind is Kind.MESSAGE:
            return await self.tokens.exists(payload["destination"], uuid.UUID(key))
        return None

    async def _http_delete(self, url: str) -> None:
        if self.http is None:
            return
        fp = self.failpoints
        await fp.hit("before_delete")
        await self.http.delete(url)
        await fp.hit("after_delete")
