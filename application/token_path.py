"""The token path (protocol 3): a message may be processed only while its token exists."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

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
    are the endpoint's own (addressed to it); `colocated`: they live in the partition
    store's database, so the token is read in the TR load's snapshot. Construct through
    `application.assembly.build_processor`.

    `attempt` returns when the message was processed now and raises `Duplicate`,
    `MalformedMessage` (no token header: the sender made no token), `Conflict` (the
    processor retries), `PermanentError` or `TransientError`.
    """

    def __init__(self, steps: Steps, tokens: IncomingTokens, colocated: bool = False) -> None:
        self.steps, self.tokens, self.colocated = steps, tokens, colocated

    async def attempt(self, envelope: Envelope) -> None:
        """One attempt at `envelope`. With co-located tokens the claim check is read with the
        TR: the partition is taken from the delivery's body, and the token's message, read
        in the TR's snapshot, is used only when it is that body; anything else goes the
        general way, where the token's body decides (protocol 3.1, 3.2)."""
        if envelope.header(TOKEN_HEADER) is None:
            raise MalformedMessage("no token header: the sender did not create a token")
        steps, m = self.steps, envelope.message_id
        claimed = self._claimed_partition(envelope) if self.colocated else None
        if claimed is not None:
            message, partition = claimed
            async with steps.locks.hold(partition), steps.store.session():
                loaded = await steps.store.load(partition, m)
                await steps.hit("after_token_load")
                stored = loaded.token
                if stored is None:
                    raise Duplicate
                if stored.type == envelope.type and stored.body == envelope.body:
                    await self._held(stored, message, partition, loaded)
                    return
        stored = await self.load(m)
        message = steps.runner.decode(stored)
        partition = steps.runner.partition_of(message)
        async with steps.locks.hold(partition), steps.store.session():
            await self._held(stored, message, partition)

    def _claimed_partition(self, envelope: Envelope) -> tuple[Any, str] | None:
        """The delivery's message and partition, as its body says; None when it does not
        decode (the token's body decides, and fails alone)."""
        try:
            message = self.steps.runner.decode(envelope)
            return message, self.steps.runner.partition_of(message)
        except Exception:  # noqa: BLE001 - the general way reads the token's body
            return None

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
        loaded = await self.steps.settle_committed(partition, m, m if self.colocated else None,
                                                   loaded)
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
