"""Settling deliveries: outcomes and errors mapped to ack, retry, dead-letter (protocol 7)."""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from collections.abc import AsyncIterator, Sequence

from application.errors import Conflict, DeadLetterRefused, PermanentError, TransientError
from application.failpoints import Failpoints
from application.observability import (
    MESSAGE_DEAD_LETTER_REFUSED,
    MESSAGE_DEAD_LETTERED,
    MESSAGE_RETRIED,
    SETTLEMENT_FAILED,
)
from application.ports import Delivery
from application.processor import Outcome, Processor


class Settlement(enum.StrEnum):
    """How a delivery was settled; every delivery ends as exactly one of these (an
    `UNSETTLED` one comes back as a new delivery)."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    RETRIED = "retried"
    DEAD_LETTERED = "dead_lettered"
    #: settling itself failed (connection lost): the broker redelivers the message
    UNSETTLED = "unsettled"


class Consumer:
    """Runs an endpoint's `Processor` on deliveries and settles each one.

    - duplicate or processed: ack;
    - `PermanentError`: dead-letter with its reason (the token stays); the dead letter of a
      message no replay can fix (malformed, unknown type) carries at most
      `dead_letter_body_bytes` of its body, with its size and SHA-256;
    - `TransientError`, `Conflict` or an unexpected adapter error: delayed redelivery after
      `retry_delays[attempt - 1]` seconds (the last delay repeats), and dead-letter with
      "retries exhausted" once `max_attempts` deliveries failed;
    - a dead letter the dead-letter queue refuses (full): delayed redelivery after the
      longest delay, with the event `message.dead_letter_refused`; the message waits, it is
      never dropped.
    `counts` holds the settlements, so every delivery is accounted for.
    """

    def __init__(
        self,
        processor: Processor,
        max_attempts: int = 5,
        retry_delays: Sequence[float] = (0.05, 0.2, 1.0, 5.0),
        failpoints: Failpoints | None = None,
        dead_letter_body_bytes: int = 4096,
    ) -> None:
        self.processor = processor
        self.dead_letter_body_bytes = dead_letter_body_bytes
        self.max_attempts = max_attempts
        self.retry_delays = tuple(retry_delays)
        self.counts: Counter[Settlement] = Counter()
        self._fp = failpoints

    async def settle(self, delivery: Delivery) -> Settlement:
        """Process one delivery and settle it; returns the settlement."""
        name = self.processor.endpoint
        events = self.processor.events
        try:
            outcome = await self.processor.process(delivery.envelope)
        except PermanentError as exc:
            return await self._dead_letter(delivery, exc.reason, exc.replayable)
        except (TransientError, Conflict, Exception) as exc:  # noqa: BLE001 - adapter errors retry
            reason = f"{type(exc).__name__}: {exc}"
            if delivery.attempt >= self.max_attempts:
                return await self._dead_letter(
                    delivery, f"retries exhausted after {delivery.attempt} attempts: {reason}")
            delay = self.retry_delays[min(delivery.attempt, len(self.retry_delays)) - 1]
            await delivery.retry(delay, reason)
            events.emit(MESSAGE_RETRIED, endpoint=name,
                        message_id=str(delivery.envelope.message_id),
                        attempt=delivery.attempt, delay_s=delay, reason=reason)
            self.counts[Settlement.RETRIED] += 1
            return Settlement.RETRIED
        if self._fp:
            await self._fp.hit("before_ack")
        await delivery.ack()
        settlement = (Settlement.PROCESSED if outcome is Outcome.PROCESSED
                      else Settlement.DUPLICATE)
        self.counts[settlement] += 1
        return settlement

    async def _dead_letter(self, delivery: Delivery, reason: str,
                           replayable: bool = True) -> Settlement:
        name = self.processor.endpoint
        try:
            await delivery.dead_letter(reason, name,
                                       None if replayable else self.dead_letter_body_bytes)
        except DeadLetterRefused:
            delay = self.retry_delays[-1]
            await delivery.retry(delay, f"dead-letter queue full; {reason}")
            self.processor.events.emit(
                MESSAGE_DEAD_LETTER_REFUSED, endpoint=name,
                message_id=str(delivery.envelope.message_id), attempt=delivery.attempt,
                delay_s=delay, reason=reason)
            self.counts[Settlement.RETRIED] += 1
            return Settlement.RETRIED
        self.processor.events.emit(
            MESSAGE_DEAD_LETTERED, endpoint=name, message_id=str(delivery.envelope.message_id),
            attempt=delivery.attempt, reason=reason)
        self.counts[Settlement.DEAD_LETTERED] += 1
        return Settlement.DEAD_LETTERED

    async def serve(self, deliveries: AsyncIterator[Delivery], prefetch: int = 8) -> None:
        """Settle deliveries as they come, at most `prefetch` at a time, until the iterator
        ends; then wait for those in flight (graceful shutdown). An error of the iterator
        (the broker is gone for good) is raised after those in flight have finished."""
        slots = asyncio.Semaphore(prefetch)
        tasks: set[asyncio.Task[Settlement | None]] = set()

        async def one(delivery: Delivery) -> Settlement | None:
            try:
                return await self.settle(delivery)
            except TransientError as exc:
                # settling failed (the connection went away): the broker redelivers the
                # message, and the protocol makes the second processing a no-op
                self.processor.events.emit(
                    SETTLEMENT_FAILED, endpoint=self.processor.endpoint,
                    message_id=str(delivery.envelope.message_id), reason=str(exc))
                self.counts[Settlement.UNSETTLED] += 1
                return None
            finally:
                slots.release()

        try:
            async for delivery in deliveries:
                await slots.acquire()
                task = asyncio.create_task(one(delivery))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:  # the source ended or failed: the deliveries in flight finish either way
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
