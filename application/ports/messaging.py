"""Messages in and out: publishing to endpoint queues, one broker delivery to settle, where a
consumer's deliveries come from, dead letters published outside a delivery, and a boundary
endpoint's inbox."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Protocol

from application.envelope import Envelope


class MessageDispatcher(Protocol):
    """Publishes messages to endpoint queues.

    `dispatch` returns only once the broker confirmed the message (publisher confirm); raises
    `TransientError` otherwise. Re-dispatching an ID is harmless: receivers drop copies.
    """

    async def dispatch(self, destination: str, envelope: Envelope) -> None:
        """Publish `envelope` persistently to the queue of endpoint `destination`."""


class DeadLetterPublisher(Protocol):
    """Dead letters published outside a delivery (the inbox relay's rows that cannot be
    relayed)."""

    async def dead_letter(self, endpoint: str, envelope: Envelope) -> None:
        """Publish `envelope` (a dead-letter copy: its headers say why) to `endpoint`'s
        dead-letter queue, confirmed. Raises `TransientError` when the broker fails or the
        queue is full (the caller tries again later)."""


class InboxClaim(Protocol):
    """Pending inbox rows held by one relay until its claim ends: no other claim sees them
    meanwhile. `mark_relayed` takes effect when the claim ends without an exception; when it
    ends with one (a crash) nothing is marked and the rows are pending again."""

    #: the claimed rows, oldest first: natural message ID, type, body (no headers) and the
    #: producer that added the row (`Envelope.producer`)
    envelopes: Sequence[Envelope]

    async def mark_relayed(self, rows: Sequence[Envelope]) -> None:
        """Mark these claimed rows (by producer and message ID; others are ignored) relayed:
        published and confirmed by the broker, to the work queue or, for a row that cannot
        be relayed, to the dead-letter queue."""


class Inbox(Protocol):
    """A boundary endpoint's inbox (protocol 4): commands of outside producers under their
    natural message IDs, waiting to be relayed to the endpoint's work queue.

    The producer and its natural ID are the key: adding an ID that producer added before,
    relayed or not, is a no-op, so a re-run producer adds no duplicate, and no producer can
    squat another's IDs. The producer is the identity the store authenticated: PostgreSQL's
    role that inserted the row (`current_user`); the memory adapter takes the envelope's
    `producer` as given. Relayed rows stay (with their relay time) until the
    retention purge; that window is the one in which a re-run is recognised. Relaying is
    at least once: the endpoint's own outbox deduplication drops a re-published copy.
    Raises `TransientError` when the store is unreachable.
    """

    async def add(self, envelopes: Sequence[Envelope]) -> int:
        """Insert the rows whose (producer, message ID) are new; returns how many were
        new."""

    def claim(self, limit: int) -> AbstractAsyncContextManager[InboxClaim]:
        """Claim up to `limit` (>= 1) pending rows, oldest first, skipping rows another
        claim holds; an empty claim when none is pending."""

    async def purge_relayed(self, before: datetime) -> int:
        """Delete rows relayed before `before` (never a pending one); returns how many."""

    async def count_pending(self) -> int:
        """Rows not relayed yet."""


class Delivery(Protocol):
    """One broker delivery of an envelope, to be settled exactly once. A copy (retry or dead
    letter) carries the envelope's headers (the protocol's and the kept ones, each capped:
    `application.envelope.known_headers`) plus its own, every value capped too."""

    envelope: Envelope
    #: 1 on first delivery, incremented by each delayed redelivery.
    attempt: int

    async def ack(self) -> None:
        """Remove the delivery from the queue."""

    async def retry(self, delay_s: float, reason: str) -> None:
        """Redeliver after `delay_s` seconds (delayed-retry queue), counting an attempt."""

    async def dead_letter(self, reason: str, endpoint: str, body_limit: int | None = None
                          ) -> None:
        """Move to the dead-letter queue with reason, endpoint, attempt and time headers
        (`application.envelope.dead_letter_headers`); with `body_limit`, the copy carries
        at most that many bytes of the body plus its size and SHA-256
        (`application.envelope.clipped_body`: a message no replay can use). While the
        dead-letter queue is full this waits, holding the delivery, and the endpoint takes
        no new delivery; raises `TransientError` when the broker fails or the delivery is
        given back meanwhile (the broker redelivers it)."""

    async def release(self) -> None:
        """Give the delivery back to its queue for redelivery, when its settlement failed
        before reaching the broker (an error of this process, a failpoint) and its channel
        still lives: else the broker would hold it, unacked, until the channel closes, and
        it would take a slot of the channel's prefetch all that time. A no-op once an ack
        or a copy was attempted (the broker may have it: settling twice is refused), or
        when the channel is gone (the broker has requeued it). Raises `TransientError` when
        the broker cannot be told."""


class DeliverySource(Protocol):
    """One consumer's deliveries of one endpoint's work queue: RabbitMQ's
    (`adapters.rabbitmq.consumer.RabbitSource`) or the memory broker's
    (`adapters.memory.source.MemorySource`). `application.consumer_process.ConsumerProcess`
    runs a consumer on either."""

    @property
    def dead_lettered(self) -> int:
        """Deliveries the source dead-lettered itself, before any processing (they could not
        become envelopes); never yielded."""

    async def start(self, prefetch: int) -> None:
        """Consume now, at most `prefetch` deliveries unsettled at a time (`deliveries`
        starts otherwise). Raises `TransientError` when the queue cannot be consumed."""

    def deliveries(self, prefetch: int) -> AsyncIterator[Delivery]:
        """The deliveries, at most `prefetch` unsettled at a time, until `stop`; deliveries
        yielded before `stop` stay settleable. Raises `TransientError` when the queue cannot
        be consumed at start; a source that gives up on its broker raises its own error
        (`BrokerUnavailable`) after the end."""

    async def stop(self) -> None:
        """End `deliveries` (idempotent); what was received and not yielded goes back to
        the queue."""
