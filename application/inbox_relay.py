"""The inbox relay (protocol 4 at the boundary): pending inbox rows published to the boundary
endpoint's work queue under their natural message IDs, then marked relayed; a row that cannot
be relayed is dead-lettered instead, so it never blocks the rows behind it."""

from __future__ import annotations

import asyncio
from datetime import datetime
from types import MappingProxyType

from application import defaults
from application.envelope import (
    PRODUCER_HEADER,
    TYPE_HEADER,
    Envelope,
    capped,
    clipped_body,
    dead_letter_headers,
)
from application.errors import TransientError
from application.observability import INBOX_DEAD_LETTERED, INBOX_RELAY_FAILED, INBOX_RELAYED
from application.ports import Clock, DeadLetterPublisher, EventSink, Inbox, MessageDispatcher

#: The longest message type the broker carries (AMQP's `type` is a short string: bytes).
MAX_TYPE_BYTES = 255


def unrelayable(envelope: Envelope, max_body_bytes: int) -> str | None:
    """Why an inbox row cannot be relayed (None: it can): no type, a type longer than
    `MAX_TYPE_BYTES` in UTF-8, a body over `max_body_bytes`. What the gateway's source
    would refuse, found before it blocks the relay."""
    size = len(envelope.type.encode())
    if not size:
        return "no type"
    if size > MAX_TYPE_BYTES:
        return f"type of {size} bytes exceeds the broker's {MAX_TYPE_BYTES}"
    if (body := len(envelope.body)) > max_body_bytes:
        return f"body of {body} bytes exceeds the limit of {max_body_bytes}"
    return None


def dead_letter_copy(envelope: Envelope, endpoint: str, reason: str, at: datetime,
                     body_limit: int) -> Envelope:
    """The dead letter of an inbox row that cannot be relayed: at most `body_limit` bytes of
    its body (with its size and SHA-256), its type in `eo-type` (capped: the message's own
    may be what the broker refuses), the producer, and why."""
    body, sizes = clipped_body(envelope.body, body_limit)
    headers = {**dead_letter_headers(reason, endpoint, 1, at), **sizes,
               TYPE_HEADER: capped(envelope.type)}
    if envelope.producer:
        headers[PRODUCER_HEADER] = envelope.producer
    return Envelope(envelope.message_id, "", body, MappingProxyType(headers),
                    envelope.producer)


class InboxRelay:
    """Moves endpoint `endpoint`'s inbox rows to its work queue, at least once.

    One round claims up to `batch_size` pending rows, dispatches each (publisher confirm,
    AMQP message ID = the natural ID, no token header: the endpoint is an outbox endpoint),
    and marks the confirmed ones relayed in the claim. A crash between publish and mark
    leaves the rows pending, so the next round publishes them again; the endpoint's inbox
    rows of processed messages (`eo_processed_message`, protocol 4) drop that copy, and a
    copy of a message not processed yet is one more delivery of the same message ID.

    A row that cannot be relayed (`unrelayable`, or a dispatch failing with anything but a
    `TransientError`: the broker refusing the message itself) is dead-lettered to the
    endpoint's dead-letter queue through `dead_letters` and marked, logged as the ERROR
    event `inbox.dead_lettered` with its reason: before, 200 such rows (a 300-character
    type) at the head of the inbox blocked every row behind them for good.
    """

    def __init__(self, endpoint: str, inbox: Inbox, dispatcher: MessageDispatcher,
                 events: EventSink, batch_size: int = 200,
                 dead_letters: DeadLetterPublisher | None = None, clock: Clock | None = None,
                 max_body_bytes: int = defaults.MAX_BODY_BYTES,
                 dead_letter_body_bytes: int = defaults.DEAD_LETTER_BODY_BYTES) -> None:
        """`dead_letters` and `clock` (which stamps the dead letters) are needed to
        dead-letter a row: without them such a row stays pending (ValueError when only one
        is given)."""
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if (dead_letters is None) != (clock is None):
            raise ValueError("dead_letters and clock go together")
        self.endpoint, self.inbox, self.dispatcher = endpoint, inbox, dispatcher
        self.events, self.batch_size = events, batch_size
        self.dead_letters, self.clock = dead_letters, clock
        self.max_body_bytes, self.dead_letter_body_bytes = max_body_bytes, dead_letter_body_bytes
        #: rows published and marked relayed by this relay
        self.relayed = 0
        #: rows dead-lettered and marked by this relay
        self.dead_lettered = 0

    async def relay_once(self) -> int:
        """One round; returns the rows relayed (0: none pending). Raises `TransientError`
        when a dispatch failed: the rows confirmed before are marked, the others stay
        pending for the next round."""
        async with self.inbox.claim(self.batch_size) as claim:
            if not claim.envelopes:
                return 0
            outcomes = await asyncio.gather(*(self._relay(e) for e in claim.envelopes),
                                            return_exceptions=True)
            for outcome in outcomes:  # a crash (test stand-in: Crash) marks nothing
                if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                    raise outcome
            done = [(e, o) for e, o in zip(claim.envelopes, outcomes, strict=True)
                    if o is None or isinstance(o, str)]
            await claim.mark_relayed([e for e, _ in done])
        for envelope, reason in done:
            if reason is None:
                self.relayed += 1
                self.events.emit(INBOX_RELAYED, endpoint=self.endpoint,
                                 message_id=str(envelope.message_id), type=envelope.type)
            else:
                self.dead_lettered += 1
                self.events.emit(INBOX_DEAD_LETTERED, endpoint=self.endpoint,
                                 message_id=str(envelope.message_id), reason=reason,
                                 type=capped(envelope.type, 80), producer=envelope.producer)
        failed = [o for o in outcomes if isinstance(o, Exception)]
        if failed:
            raise TransientError(f"{len(failed)} of {len(outcomes)} dispatches failed: "
                                 f"{type(failed[0]).__name__}: {failed[0]}")
        return len(done)

    async def _relay(self, envelope: Envelope) -> str | None:
        """Publish one row; returns None when relayed, the reason when dead-lettered.
        Raises `TransientError` when neither went through (the row stays pending)."""
        reason = unrelayable(envelope, self.max_body_bytes)
        if reason is None:
            try:
                await self.dispatcher.dispatch(self.endpoint, envelope)
                return None
            except TransientError:
                raise
            except Exception as exc:  # noqa: BLE001 - the broker refuses this message itself
                reason = f"cannot be relayed: {type(exc).__name__}: {exc}"
        if self.dead_letters is None or self.clock is None:
            raise TransientError(f"{envelope.message_id} cannot be relayed ({reason}), and "
                                 "this relay has no dead-letter queue")
        await self.dead_letters.dead_letter(self.endpoint, dead_letter_copy(
            envelope, self.endpoint, reason, self.clock.now(), self.dead_letter_body_bytes))
        return reason

    async def drain(self) -> int:
        """Rounds until none is pending; returns the rows relayed. Raises like
        `relay_once`."""
        total = 0
        while relayed := await self.relay_once():
            total += relayed
        return total

    async def run(self, interval_s: float) -> None:
        """Drain, then wait `interval_s` seconds, forever (cancel the task to stop). A failed
        round emits `inbox.relay_failed` with the error and is tried again after the
        interval: the relay must outlive a broker or database outage."""
        while True:
            try:
                await self.drain()
            except Exception as exc:  # noqa: BLE001 - any failure: the next round retries
                self.events.emit(INBOX_RELAY_FAILED, endpoint=self.endpoint,
                                 reason=capped(f"{type(exc).__name__}: {exc}"))
            await asyncio.sleep(interval_s)
