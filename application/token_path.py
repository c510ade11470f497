"""The token path (protocol 3): a message may be processed only while its token exists."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from application.envelope import TOKEN_HEADER, Envelope
from application.errors import Duplicate, MalformedMessage
from application.ports import IncomingTokens, Loaded, TokenStore
from application.transactional_path import PathParts, TransactionalPath


@dataclass(frozen=True)
class AddressedTokens(IncomingTokens):
    """The tokens of `tokens` addressed to `endpoint`: the only ones that endpoint reads,
    checks and consumes."""

    tokens: TokenStore
    endpoint: str

    async def get(self, message_id: uuid.UUID) -> Envelope | None:
        return await self.tokens.get(self.endpoint, message_id)

    async def exists(self, message_id: uuid.UUID) -> bool:
        return await self.tokens.exists(self.endpoint, message_id)

    async def delete(self, message_id: uuid.UUID) -> None:
        await self.tokens.delete(self.endpoint, message_id)


class TokenPath(TransactionalPath):
    """The token strategy: the body is read from the token (claim check, one read with the
    token check), the token is checked again after the TR load (in the same read when
    `colocated`), and `finish` consumes it last. `tokens` are the endpoint's own (addressed
    to it). Construct through `application.assembly.build_processor`."""

    def __init__(self, parts: PathParts, tokens: IncomingTokens,
                 colocated: bool = False) -> None:
        super().__init__(parts)
        self.tokens, self.colocated = tokens, colocated

    async def load(self, envelope: Envelope) -> Envelope:
        """The message stored in its token; `MalformedMessage` without the token header (the
        sender made no token), `Duplicate` when no token addressed to this endpoint exists."""
        if envelope.header(TOKEN_HEADER) is None:
            raise MalformedMessage("no token header: the sender did not create a token")
        stored = await self.tokens.get(envelope.message_id)
        await self.hit("after_token_load")
        if stored is None:
            raise Duplicate
        return stored

    def token_to_check(self, message_id: uuid.UUID) -> uuid.UUID | None:
        return message_id if self.colocated else None

    async def still_pending(self, stored: Envelope, loaded: Loaded) -> None:
        """The token still exists: checked AFTER the TR load (protocol 3.1)."""
        exists = loaded.token_exists  # read with the TR when tokens are co-located
        if exists is None:
            exists = await self.tokens.exists(stored.message_id)
        if not exists:
            raise Duplicate
