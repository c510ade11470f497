"""The token path (protocol 3): a message may be processed only while its token exists."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from application.claim_check import ClaimCheck, ReadApart
from application.envelope import TOKEN_HEADER, Envelope
from application.errors import Duplicate, MalformedMessage
from application.ports import IncomingTokens, Loaded, TokenStore
from application.transactional_path import Steps


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


class TokenPath:
    """The token strategy on the shared steps: the body is read from the token (claim check),
    the token is checked again after the TR load, and `finish` consumes it last. `tokens`
    are the endpoint's own (addressed to it); `claim_check` says where the token is read
    (application/claim_check.py: with the TR, or apart). Construct through
    `application.assembly.build_processor`.

    `attempt` returns when the message was processed now and raises `Duplicate`,
    `MalformedMessage` (no token header: the sender made no token), `Conflict` (the
    processor retries), `PermanentError` or `TransientError`.
    """

    def __init__(self, steps: Steps, tokens: IncomingTokens,
                 claim_check: ClaimCheck | None = None) -> None:
        self.steps, self.tokens = steps, tokens
        self.claim_check: ClaimCheck = claim_check or ReadApart()

    async def attempt(self, envelope: Envelope) -> None:
        """One attempt at `envelope`: with its token read with the TR when the claim check
        can (`ClaimCheck.with_the_record`), else the general way: the token read first, its
        body decoding the message and naming the partition."""
        if envelope.header(TOKEN_HEADER) is None:
            raise MalformedMessage("no token header: the sender did not create a token")
        steps = self.steps
        if await self.claim_check.with_the_record(steps, envelope, self._held):
            return
        stored = await self.load(envelope.message_id)
        message = steps.runner.decode(stored)
        partition = steps.runner.partition_of(message)
        async with steps.locks.hold(partition), steps.store.session():
            await self._held(stored, message, partition)

    async def load(self, message_id: uuid.UUID) -> Envelope:
        """The message stored in its token; `Duplicate` when no token addressed to this
        endpoint exists."""
        stored = await self.tokens.get(message_id)
        await self.steps.hit("after_token_load")
        if stored is None:
            raise Duplicate
        return stored

    async def _held(self, stored: Envelope, message: Any, partition: str,
                    loaded: Loaded | None = None) -> None:
        """Under `partition`'s lock, from the TR load on (`loaded`: that read, when made
        already): settle what is committed, re-check the token, run the steps."""
        m = stored.message_id
        loaded = await self.steps.settle_committed(
            partition, m, self.claim_check.token_to_check(m), loaded)
        await self.still_pending(m, loaded)
        await self.steps.hit("after_token_check")
        await self.steps.run(stored, message, partition, loaded)

    async def still_pending(self, message_id: uuid.UUID, loaded: Loaded) -> None:
        """The token still exists: checked AFTER the TR load (protocol 3.1); raises
        `Duplicate`."""
        exists = loaded.token_exists  # read with the TR when tokens are co-located
        if exists is None:
            exists = await self.tokens.exists(message_id)
        if not exists:
            raise Duplicate
