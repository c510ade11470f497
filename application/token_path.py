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

    async def attempt(self, envelope: Envelope) -> None:
        """One attempt at `envelope` (see `TransactionalPath`). With co-located tokens the
        claim check is read with the TR: the partition is taken from the delivery's body,
        and the token's message, read in the TR's snapshot, is used only when it is that
        body (anything else goes the general way, where the token's body decides). One
        statement fewer per message; the token read still precedes its re-check, which is
        the same snapshot as the TR load (protocol 3.1, 3.2)."""
        if not self.colocated:
            await super().attempt(envelope)
            return
        if envelope.header(TOKEN_HEADER) is None:
            raise MalformedMessage("no token header: the sender did not create a token")
        try:
            message = self.runner.decode(envelope)
            partition = self.runner.partition_of(message)
        except Exception:  # noqa: BLE001 - the token's body decides, and fails alone
            await super().attempt(envelope)
            return
        m = envelope.message_id
        async with self.locks.hold(partition):
            loaded = await self.store.load(partition, m)
            await self.hit("after_token_load")
            stored = loaded.token
            if stored is None:
                raise Duplicate
            if stored.type == envelope.type and stored.body == envelope.body:
                await self._attempt_held(stored, message, partition, loaded)
                return
        await super().attempt(envelope)  # the delivery is not the token's message

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
