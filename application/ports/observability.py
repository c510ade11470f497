"""What the protocol observes and is given: the clock, fresh IDs, structured events and
spans (protocol 9)."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Protocol


class Clock(Protocol):
    """Wall-clock time, injected so the protocol and its tests control it."""

    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""


class IdGenerator(Protocol):
    """Fresh attempt, message and artifact IDs (uuid4 in production, seeded in tests)."""

    def __call__(self) -> uuid.UUID:
        """A new unique ID."""


class EventSink(Protocol):
    """Structured events of protocol 9 (logged as JSON and counted as metrics)."""

    def emit(self, event: str, **fields: object) -> None:
        """Record `event` with its fields (endpoint, message_id, attempt_id, partition, ...)."""


class SpanKind(enum.StrEnum):
    """What a span stands for, as OpenTelemetry's span kinds: a message processed
    (`CONSUMER`), a message published (`PRODUCER`), a request to another service
    (`CLIENT`), a step inside either (`INTERNAL`)."""

    INTERNAL = "internal"
    CONSUMER = "consumer"
    PRODUCER = "producer"
    CLIENT = "client"


#: A span attribute's value (OpenTelemetry's primitive attribute types).
SpanValue = str | int | bool


class Span(Protocol):
    """One span of a `Tracer`, started and not yet ended."""

    def set(self, name: str, value: SpanValue) -> None:
        """Set attribute `name` (e.g. `eo.outcome`)."""

    def current(self) -> AbstractContextManager[None]:
        """Make this span the current one inside the `with` block (its children, and the
        trace context `Tracer.headers` gives, are this span's); it does not end it."""

    def end(self, error: BaseException | None = None) -> None:
        """End the span; `error` marks it failed and is recorded as an exception event."""


class Tracer(Protocol):
    """Spans of the protocol's steps (OpenTelemetry: adapters/tracing.py). Where tracing is
    off the tracer is `application.ports.null_tracer.NULL_TRACER`, whose spans record nothing.

    A message's trace context travels in its headers (`TRACE_HEADERS`: W3C `traceparent`
    and `tracestate`), written when the message is prepared, so it is part of the committed
    message: every delivery of a message, on every attempt, continues the trace of the
    attempt that committed it."""

    def start(self, name: str, kind: SpanKind = SpanKind.INTERNAL,
              attributes: Mapping[str, SpanValue] | None = None,
              parent: Mapping[str, str] | None = None,
              links: Sequence[Mapping[str, str]] = ()) -> Span:
        """A new span, not yet current. `parent`: message headers whose trace context is
        the span's parent (without one, the current span is); `links`: message headers
        whose trace contexts the span links to (a batch links each message's)."""

    def span(self, name: str, kind: SpanKind = SpanKind.INTERNAL,
             attributes: Mapping[str, SpanValue] | None = None,
             parent: Mapping[str, str] | None = None,
             links: Sequence[Mapping[str, str]] = ()) -> AbstractContextManager[Span]:
        """`start`, current inside the `with` block and ended at its exit (failed when the
        block raises)."""

    def headers(self) -> dict[str, str]:
        """The current trace context as message headers (`TRACE_HEADERS`); empty when no
        span is current."""
