"""How the token of an outgoing message is made (protocol 3.2), chosen once when the system
is built (`application.assembly`): inserted by the commit itself when the tokens share the
partition store's database (`InsertedByTheCommit`, the fast path: the token then stands for
its side-effect record), or registered, created and re-checked before the commit otherwise
(`CreatedBeforeTheCommit`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import ClassVar, Protocol

from application.envelope import Envelope
from application.ports import TokenStore


class OutgoingTokens(Protocol):
    """Where `Preparation` makes an outgoing message's token."""

    #: whether the commit inserts the token (then nothing is created before it)
    by_the_commit: ClassVar[bool]

    async def create(self, destination: str, envelope: Envelope) -> None:
        """Create the token of `envelope`, addressed to `destination`, before the commit."""

    async def delete(self, destination: str, message_id: uuid.UUID) -> None:
        """Delete a token `create` made (an aborted attempt's)."""


@dataclass(frozen=True)
class InsertedByTheCommit:
    """Tokens in the partition store's database: the commit inserts them in its own
    statement, so a token exists exactly when its commit does."""

    by_the_commit: ClassVar[bool] = True

    async def create(self, destination: str, envelope: Envelope) -> None:
        raise ValueError("tokens inserted by the commit are not created before it")

    async def delete(self, destination: str, message_id: uuid.UUID) -> None:
        raise ValueError("tokens inserted by the commit are not created before it")


@dataclass(frozen=True)
class CreatedBeforeTheCommit:
    """Tokens in a store of their own (`tokens`): each is an artifact, registered, created
    and re-checked before the commit like a blob (protocol 3.2)."""

    tokens: TokenStore
    by_the_commit: ClassVar[bool] = False

    async def create(self, destination: str, envelope: Envelope) -> None:
        await self.tokens.create(destination, [envelope])

    async def delete(self, destination: str, message_id: uuid.UUID) -> None:
        await self.tokens.delete(destination, message_id)
