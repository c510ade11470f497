"""Settling deliveries: outcomes and errors mapped to ack, retry, dead-letter (protocol 7)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Sequence

from application import defaults
from application.errors import PermanentError, TransientError
from application.failpoints import NO_FAILPOINTS, Failpoints
from application.observability import (
    MESSAGE_DEAD_LETTERED,
    MESSAGE_RETRIED,
    SETTLEMENT_FAILED,
)
from application.outcome import Outcome
from application.ports import Delivery
from application.processor import Processor


class _Unsettled(TransientError):
    """A retry or dead letter that could not be published (the connection went away): the
    broker redelivers the delivery. `settlement` says which ("retry", "dead_letter"), so
    the `message.settlement_failed` event tells an aborted attempt from a lost ack."""

    def __init__(self, settlement: str, cause: TransientError) -> None:
        super().__init__(str(cause))
        self.settlement = settlement


def batches_in_flight(prefetch: int, batch_size: int) -> int:
    """How many batches a consumer processes at a time: `prefetch // batch_size - 1`, at
    least 1. One batch's worth of the prefetch is left to the deliveries that wait, so
    that under load a batch starting when another ends finds a full batch: with every
    slot's worth in process, the broker refills a slot's acks as a burst and a free slot
    takes its first few deliveries, and the batches alternate between full and tiny ones
    (docs/batching.md has the measurements)."""
    return max(1, prefetch // batch_size - 1)


def default_prefetch(batches: bool, batch_size: int) -> int:
    """A consumer's deliveries in flight (RabbitMQ's `prefetch_count`) when `EO_PREFETCH` is
    unset: for a consumer that batches (`Settler.batches`), `defaults.PREFETCH_IN_BATCHES`
    (3) times `batch_size`: two batches in process and the next one's deliveries waiting
    (docs/batching.md); for one that does not, `defaults.SINGLE_PREFETCH` (8): a consumer
    that processes one delivery at a time is CPU-bound well below that (docs/bench.md), and
    what it holds unacked waits for nothing but adds to a redelivery burst."""
    if batches:
        return defaults.PREFETCH_IN_BATCHES * batch_size
    return defaults.SINGLE_PREFETCH


class Settler:
    """Settles an endpoint's deliveries: runs its `Processor` on each (alone, or in batches)
    and acks, retries or dead-letters the delivery by the outcome.

    - duplicate or processed: ack;
    - `PermanentError`: dead-letter with its reason (the token stays); the dead letter of a
      message no replay can fix (malformed, unknown type) carries at most
      `dead_letter_body_bytes` of its body, with its size and SHA-256; while the
      dead-letter queue is full the delivery waits in `Delivery.dead_letter`, held;
    - `TransientError`, `Conflict` or an unexpected adapter error: delayed redelivery after
      `retry_delays[attempt - 1]` seconds (the last delay repeats), and dead-letter with
      "retries exhausted" once `max_attempts` deliveries failed.
    `counts` holds the settlements, so every delivery is accounted for.
    """

    def __init__(
        self,
        processor: Processor,
        max_attempts: int = defaults.MAX_ATTEMPTS,
        retry_delays: Sequence[float] = defaults.RETRY_DELAYS_S,
        failpoints: Failpoints = NO_FAILPOINTS,
        dead_letter_body_bytes: int = defaults.DEAD_LETTER_BODY_BYTES,
        batch_size: int = 1,
        batch_wait_s: float = 0.0,
    ) -> None:
        """`batch_size` > 1: `serve` hands the processor up to that many deliveries at once
        (`Processor.process_batch`; an endpoint without a batched path processes them one
        by one), those waiting when a batch starts plus what arrives within `batch_wait_s`
        seconds of its first. Raises ValueError for a size below 1 or a negative wait."""
        if batch_size < 1 or batch_wait_s < 0:
            raise ValueError(f"batch_size {batch_size} < 1 or batch_wait_s {batch_wait_s} < 0")
        self.processor = processor
        self.dead_letter_body_bytes = dead_letter_body_bytes
        self.max_attempts = max_attempts
        self.retry_delays = tuple(retry_delays)
        self.batch_size, self.batch_wait_s = batch_size, batch_wait_s
        self.counts: Counter[Outcome] = Counter()
        self._fp = failpoints

    @property
    def batches(self) -> bool:
        """Whether `serve` processes deliveries in batches: `batch_size` > 1 and a
        processor that batches (`Processor.batches`)."""
        return self.batch_size > 1 and self.processor.batches

    async def settle(self, delivery: Delivery) -> Outcome:
        """Process one delivery and settle it; returns the settlement."""
        result: Outcome | BaseException
        try:
            result = await self.processor.process(delivery.envelope)
        except Exception as exc:  # noqa: BLE001 - settled by its kind below
            result = exc
        return await self._settle(delivery, result)

    async def _settle(self, delivery: Delivery, result: Outcome | BaseException
                      ) -> Outcome:
        """Settle `delivery` by the outcome or error of its processing."""
        if isinstance(result, PermanentError):
            return await self._dead_letter(delivery, result.reason, result.replayable)
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):  # cancellation: not an outcome
                raise result
            # TransientError, Conflict or an unexpected adapter error: retry
            reason = f"{type(result).__name__}: {result}"
            if delivery.attempt >= self.max_attempts:
                return await self._dead_letter(
                    delivery, f"retries exhausted after {delivery.attempt} attempts: {reason}")
            delay = self.retry_delays[min(delivery.attempt, len(self.retry_delays)) - 1]
            try:
                await delivery.retry(delay, reason)
            except TransientError as exc:  # the broker redelivers it: a retry all the same
                raise _Unsettled("retry", exc) from exc
            self.processor.events.emit(
                MESSAGE_RETRIED, endpoint=self.processor.endpoint,
                message_id=str(delivery.envelope.message_id), attempt=delivery.attempt,
                delay_s=delay, reason=reason)
            self.counts[Outcome.RETRIED] += 1
            return Outcome.RETRIED
        await self._fp.hit("before_ack")
        await delivery.ack()
        settlement = (Outcome.PROCESSED if result is Outcome.PROCESSED
                      else Outcome.DUPLICATE)
        self.counts[settlement] += 1
        return settlement

    async def _dead_letter(self, delivery: Delivery, reason: str,
                           replayable: bool = True) -> Outcome:
        name = self.processor.endpoint
        try:  # waits while the dead-letter queue is full (the adapter holds the delivery)
            await delivery.dead_letter(reason, name,
                                       None if replayable else self.dead_letter_body_bytes)
        except TransientError as exc:  # the broker redelivers it: its attempt ended
            raise _Unsettled("dead_letter", exc) from exc
        self.processor.events.emit(
            MESSAGE_DEAD_LETTERED, endpoint=name, message_id=str(delivery.envelope.message_id),
            attempt=delivery.attempt, reason=reason)
        self.counts[Outcome.DEAD_LETTERED] += 1
        return Outcome.DEAD_LETTERED

    async def serve(self, deliveries: AsyncIterator[Delivery],
                    prefetch: int = defaults.SINGLE_PREFETCH) -> None:
        """Settle deliveries as they come, at most `prefetch` at a time, until the iterator
        ends; then wait for those in flight (graceful shutdown). An error of the iterator
        (the broker is gone for good) is raised after those in flight have finished. With
        `batch_size` > 1 and a processor that batches, deliveries are processed in batches
        (see `__init__`)."""
        if self.batches:
            await self._serve_batches(deliveries, prefetch)
            return
        slots = asyncio.Semaphore(prefetch)
        tasks: set[asyncio.Task[None]] = set()
        try:
            async for delivery in deliveries:
                await slots.acquire()
                task = asyncio.create_task(self._guarded(delivery, slots))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:  # the source ended or failed: the deliveries in flight finish either way
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve_batches(self, deliveries: AsyncIterator[Delivery], prefetch: int) -> None:
        slots = asyncio.Semaphore(prefetch)
        waiting: asyncio.Queue[Delivery | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def pump() -> None:
            try:
                async for delivery in deliveries:
                    await slots.acquire()
                    waiting.put_nowait(delivery)
            finally:
                waiting.put_nowait(None)  # the end (or the source's failure)

        pumping = asyncio.create_task(pump())
        # a batch is formed only when one of these is free: while they are all busy the
        # deliveries pile up, and the next batch takes them (the batch size follows the load)
        batches = asyncio.Semaphore(batches_in_flight(prefetch, self.batch_size))

        async def settle(batch: list[Delivery]) -> None:
            try:
                await self._settle_batch(batch, slots)
            finally:
                batches.release()

        try:
            while True:
                await batches.acquire()
                batch = await self._next_batch(waiting)
                if batch is None:
                    break
                task = asyncio.create_task(settle(batch))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:  # the deliveries in flight finish either way
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            if not pumping.done():
                pumping.cancel()
            await asyncio.gather(pumping, return_exceptions=True)
        pumping.result()  # the source's failure, after those in flight finished

    async def _next_batch(self, waiting: asyncio.Queue[Delivery | None]
                          ) -> list[Delivery] | None:
        """The next batch: the first delivery to come, those waiting behind it and what
        arrives within `batch_wait_s`, up to `batch_size`; None at the end (the end marker
        stays queued, so the next call ends too)."""
        first = await waiting.get()
        if first is None:
            waiting.put_nowait(None)
            return None
        batch = [first]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.batch_wait_s
        while len(batch) < self.batch_size:
            if waiting.empty():
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    async with asyncio.timeout(left):
                        item = await waiting.get()
                except TimeoutError:
                    break
            else:
                item = waiting.get_nowait()
            if item is None:
                waiting.put_nowait(None)
                break
            batch.append(item)
        return batch

    async def _settle_batch(self, batch: list[Delivery], slots: asyncio.Semaphore) -> None:
        results: list[Outcome | BaseException]
        try:
            results = await self.processor.process_batch([d.envelope for d in batch])
        except Exception as exc:  # noqa: BLE001 - every delivery of the batch is retried
            results = [exc] * len(batch)
        await asyncio.gather(*(self._guarded(d, slots, r)
                               for d, r in zip(batch, results, strict=True)))

    async def _guarded(self, delivery: Delivery, slots: asyncio.Semaphore,
                       result: Outcome | BaseException | None = None) -> None:
        """Process and settle `delivery` (`settle`), or only settle it with the `result` of
        its batch; a failure to settle (the connection went away) leaves the delivery to the
        broker, which redelivers it, and the protocol makes the second processing a no-op.
        Frees `delivery`'s slot in every case. The work starts here, not in the caller, so a
        task cancelled before it ran (a process stopped) leaves no coroutine behind."""
        try:
            if result is None:
                await self.settle(delivery)
            else:
                await self._settle(delivery, result)
        except TransientError as exc:
            self.processor.events.emit(
                SETTLEMENT_FAILED, endpoint=self.processor.endpoint,
                message_id=str(delivery.envelope.message_id), reason=str(exc),
                settlement=exc.settlement if isinstance(exc, _Unsettled) else "ack")
            self.counts[Outcome.UNSETTLED] += 1
            # failed before the broker heard of it (a failpoint, an error of this process):
            # redelivered now, not when the channel closes (a no-op where the broker has it)
            with contextlib.suppress(TransientError):
                await delivery.release()
        finally:
            slots.release()
