"""The inbox relay (protocol 4 at the boundary): pending inbox rows published to the boundary
endpoint's work queue under their natural message IDs, then marked relayed."""

from __future__ import annotations

import asyncio

from application.errors import TransientError
from application.observability import INBOX_RELAY_FAILED, INBOX_RELAYED
from application.ports import EventSink, Inbox, MessageDispatcher


class InboxRelay:
    """Moves endpoint `endpoint`'s inbox rows to its work queue, at least once.

    One round claims up to `batch_size` pending rows, dispatches each (publisher confirm,
    AMQP message ID = the natural ID, no token header: the endpoint is an outbox endpoint),
    and marks the confirmed ones relayed in the claim. A crash between publish and mark
    leaves the rows pending, so the next round publishes them again; the endpoint's inbox
    rows of processed messages (`eo_processed_message`, protocol 4) drop that copy, and a
    copy of a message not processed yet is one more delivery of the same message ID.
    """

    def __init__(self, endpoint: str, inbox: Inbox, dispatcher: MessageDispatcher,
                 events: EventSink, batch_size: int = 200) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.endpoint, self.inbox, self.dispatcher = endpoint, inbox, dispatcher
        self.events, self.batch_size = events, batch_size
        #: rows published and marked relayed by this relay
        self.relayed = 0

    async def relay_once(self) -> int:
        """One round; returns the rows relayed (0: none pending). Raises `TransientError`
        when a dispatch failed: the rows confirmed before are marked, the others stay
        pending for the next round."""
        async with self.inbox.claim(self.batch_size) as claim:
            if not claim.envelopes:
                return 0
            outcomes = await asyncio.gather(
                *(self.dispatcher.dispatch(self.endpoint, e) for e in claim.envelopes),
                return_exceptions=True)
            for outcome in outcomes:  # a crash (test stand-in: Crash) marks nothing
                if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                    raise outcome
            confirmed = [e for e, o in zip(claim.envelopes, outcomes, strict=True) if o is None]
            await claim.mark_relayed(confirmed)
        for envelope in confirmed:
            self.events.emit(INBOX_RELAYED, endpoint=self.endpoint,
                             message_id=str(envelope.message_id), type=envelope.type)
        self.relayed += len(confirmed)
        failed = [o for o in outcomes if isinstance(o, Exception)]
        if failed:
            raise TransientError(f"{len(failed)} of {len(outcomes)} dispatches failed: "
                                 f"{type(failed[0]).__name__}: {failed[0]}")
        return len(confirmed)

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
                                 reason=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(interval_s)
