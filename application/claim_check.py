"""How the token path reads a message's token (its claim check) and checks it again after the
transaction record's load (protocol 3.1), chosen once when the system is built
(`application.assembly`): in the same read as the transaction record when the tokens share
the partition store's database (protocol 3.2's fast path, `ReadWithTheRecord`), from the
token store on its own otherwise (`ReadApart`)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from application.envelope import Envelope
from application.errors import Duplicate
from application.ports import Loaded
from application.transactional_path import Steps

#: Runs the rest of an attempt under the partition's lock: (the token's message, its decoded
#: message, the partition, the TR load already made).
Held = Callable[[Envelope, Any, str, Loaded], Awaitable[None]]


class ClaimCheck(Protocol):
    """Where the token path reads the token of the message it processes."""

    def token_to_check(self, message_id: uuid.UUID) -> uuid.UUID | None:
        """The token the TR load reads in its snapshot (`PartitionStore.load`), or None
        when the check is a read of its own (`IncomingTokens.exists`)."""

    async def with_the_record(self, steps: Steps, envelope: Envelope, held: Held) -> bool:
        """Process `envelope` with its token read in the TR load itself, when that can be
        done (`held` runs the rest under the partition's lock): True when it was, False when
        the caller reads the token first (the general way). Raises what `held` raises, and
        `Duplicate` when the token is gone."""


def is_the_delivery(stored: Envelope, delivery: Envelope) -> bool:
    """Whether `stored`, the message a token holds, is the message `delivery` carries: the
    same type and body. Only then may a path trust what the delivery's body says (its
    partition, its decoding); any other delivery is processed as its token says (protocol
    3.1's claim check; docs/security.md). The single path with co-located tokens and the
    batched path ask it; nothing else decides it."""
    return stored.type == delivery.type and stored.body == delivery.body


@dataclass(frozen=True)
class ReadApart:
    """Tokens in a database of their own: the token is read first, its body names the
    partition, and the TR load is followed by a token check of its own."""

    def token_to_check(self, message_id: uuid.UUID) -> uuid.UUID | None:
        return None

    async def with_the_record(self, steps: Steps, envelope: Envelope, held: Held) -> bool:
        return False


@dataclass(frozen=True)
class ReadWithTheRecord:
    """Tokens in the partition store's database: the partition is taken from the delivery's
    body, and the token's message, read in the TR load's snapshot, is used only when it is
    that body; anything else goes the general way, where the token's body decides
    (protocol 3.1, 3.2). One statement fewer per message."""

    def token_to_check(self, message_id: uuid.UUID) -> uuid.UUID | None:
        return message_id

    async def with_the_record(self, steps: Steps, envelope: Envelope, held: Held) -> bool:
        try:  # the delivery's partition, as its body says
            message = steps.runner.decode(envelope)
            partition = steps.runner.partition_of(message)
        except Exception:  # noqa: BLE001 - the general way reads the token's body
            return False
        async with steps.locks.hold(partition), steps.store.session():
            loaded = await steps.store.load(partition, envelope.message_id)
            await steps.hit("after_token_load")
            stored = loaded.token
            if stored is None:
                raise Duplicate
            if is_the_delivery(stored, envelope):
                await held(stored, message, partition, loaded)
                return True
        return False
