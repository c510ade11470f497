"""The processing of one delivery: the events, the immediate retries after a conflict, and
the endpoint's strategy (application/token_path.py, outbox_path.py, state_path.py)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

from application import defaults
from application.envelope import Envelope
from application.errors import Conflict, Duplicate, TransientError
from application.finisher import Finisher
from application.handler_runner import HandlerRunner
from application.observability import (
    MESSAGE_DUPLICATE,
    MESSAGE_RECEIVED,
    TRANSACTION_CONFLICT,
    message_attributes,
)
from application.outcome import Outcome
from application.ports import EventSink, SpanKind, Tracer
from application.ports.null_tracer import NULL_TRACER
from application.token_batch import TokenBatch


class Path(Protocol):
    """A strategy's processing of one delivery: returns when the message was processed now,
    raises `Duplicate` when it was a duplicate, `Conflict` when another attempt moved the
    partition first, `PermanentError` or `TransientError`."""

    async def attempt(self, envelope: Envelope) -> None:
        """One attempt at `envelope`."""


class Processor:
    """Processes deliveries for one endpoint, exactly once in effect (protocol.md 3 and 4).

    `process(envelope)` returns an `Outcome` or raises `PermanentError` (dead-letter) or
    `TransientError` (delayed redelivery; conflicts are retried `conflict_retries` times at
    once first, each retry re-checking the token or the processed-message row, so a copy
    whose winner committed meanwhile ends as a duplicate). Build one with
    `application.assembly.build_processor`.
    """

    def __init__(self, endpoint: str, path: Path, runner: HandlerRunner,
                 events: EventSink, conflict_retries: int = defaults.CONFLICT_RETRIES,
                 finisher: Finisher | None = None, batch: TokenBatch | None = None,
                 tracer: Tracer = NULL_TRACER) -> None:
        """`finisher`: the path's (None for the state strategy), for the sweeper and tests;
        `batch`: the batched token path (co-located tokens only), used by `process_batch`;
        `tracer`: a `process <endpoint>` span per delivery (its parent the message's trace
        context) and one per batch (linking each message's)."""
        self.endpoint, self.path, self.runner = endpoint, path, runner
        self.events, self.conflict_retries = events, conflict_retries
        self.finisher, self.batch, self.tracer = finisher, batch, tracer

    def decode(self, envelope: Envelope) -> Any:
        """The domain message of `envelope`; raises `UnknownMessageType` / `MalformedMessage`."""
        return self.runner.decode(envelope)

    @property
    def batches(self) -> bool:
        """Whether `process_batch` batches (the token path with co-located tokens)."""
        return self.batch is not None

    async def process(self, envelope: Envelope) -> Outcome:
        """Process one delivery; see the class docstring for the errors raised."""
        if self.tracer is NULL_TRACER:  # tracing off: no span, and no frame for one
            return await self._attempts(envelope, self._received(envelope))
        return await self._traced(envelope, received=True)

    async def _traced(self, envelope: Envelope, received: bool = False) -> Outcome:
        """`_attempts` in a `process <endpoint>` span whose parent is the message's trace
        context (messaging semantic conventions' attributes, and `eo.outcome`); with
        `received`, `message.received` is emitted in it first."""
        m = envelope.id_text
        with self.tracer.span(f"process {self.endpoint}", SpanKind.CONSUMER,
                         message_attributes(self.endpoint, m),
                         parent=envelope.headers) as span:
            if received:
                self._received(envelope)
            outcome = await self._attempts(envelope, m)
            span.set("eo.outcome", str(outcome))
        return outcome

    async def process_batch(self, envelopes: Sequence[Envelope]
                            ) -> list[Outcome | BaseException]:
        """Process deliveries together (application/token_batch.py); one result per
        envelope, in order: its `Outcome`, or the error `process` would have raised for it
        (nothing is raised). Without a batched path, each is processed on its own, all at
        once."""
        results: dict[int, Outcome | BaseException] = {}
        tracer = self.tracer
        # a batch's own events in its span (once per batch), each message's in the message's
        batch_span: AbstractContextManager[object] = nullcontext()
        if self.batch is not None and tracer is not NULL_TRACER:  # links: a list a message
            batch_span = tracer.span(f"process batch {self.endpoint}", SpanKind.CONSUMER,
                                     {"messaging.destination.name": self.endpoint,
                                      "messaging.batch.message_count": len(envelopes)},
                                     links=[e.headers for e in envelopes])
        with batch_span:
            for envelope in envelopes:
                self._received(envelope)
            if self.batch is not None:
                results = await self.batch.run(envelopes)
        singles = [i for i in range(len(envelopes)) if i not in results]
        attempts = self._attempts if tracer is NULL_TRACER else self._traced
        alone = await asyncio.gather(*(attempts(envelopes[i]) for i in singles),
                                     return_exceptions=True)
        for i, outcome in zip(singles, alone, strict=True):
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # cancelled (or a test's crash): no delivery is settled
            results[i] = outcome
        return [results[i] for i in range(len(envelopes))]

    def _received(self, envelope: Envelope) -> str:
        """Emit `message.received`; returns the message ID as text."""
        # the body's digest lets an audit of the logs check I2 (every copy identical)
        m = envelope.id_text
        self.events.emit(MESSAGE_RECEIVED, endpoint=self.endpoint, message_id=m,
                         type=envelope.type,
                         body_sha256=hashlib.sha256(envelope.body).hexdigest()[:16])
        return m

    async def _attempts(self, envelope: Envelope, m: str | None = None) -> Outcome:
        """Attempts at `envelope` until one is not a conflict (`conflict_retries` + 1 at
        most); see the class docstring."""
        ev, name, m = self.events, self.endpoint, m or envelope.id_text
        for _ in range(self.conflict_retries + 1):
            try:
                await self.path.attempt(envelope)
                return Outcome.PROCESSED
            except Duplicate:
                ev.emit(MESSAGE_DUPLICATE, endpoint=name, message_id=m)
                return Outcome.DUPLICATE
            except Conflict as exc:
                ev.emit(TRANSACTION_CONFLICT, endpoint=name, message_id=m, reason=str(exc))
        raise TransientError(f"optimistic-concurrency conflict {self.conflict_retries + 1} times")

