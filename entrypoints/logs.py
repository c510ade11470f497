"""structlog configuration and the event sink that logs protocol events as JSON lines."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from opentelemetry import trace
from structlog.typing import EventDict, Processor

#: whether `configure_logging` configured structlog, and whether lines carry trace IDs
_configured = False
_trace_ids = False


def add_trace_ids(_logger: object, _method: str, event: EventDict) -> EventDict:
    """structlog processor: `trace_id` (32 hex digits) and `span_id` (16) of the current
    span, when there is one (W3C trace context's forms, as trace back-ends show them)."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event["trace_id"] = format(context.trace_id, "032x")
        event["span_id"] = format(context.span_id, "016x")
    return event


def _processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        *([add_trace_ids] if _trace_ids else []),
        structlog.processors.dict_tracebacks,
        structlog.processors.JSONRenderer(sort_keys=True),
    ]


def log_trace_ids(on: bool) -> None:
    """Whether log lines carry the current span's `trace_id` and `span_id` (tracing on:
    entrypoints/tracing.py); takes effect once `configure_logging` configured logging."""
    global _trace_ids
    _trace_ids = on
    if _configured:
        structlog.configure(processors=_processors())


def configure_logging(level: str = "INFO", stream: TextIO | None = None) -> None:
    """JSON lines with ISO timestamps on `stream` (stderr by default) at `level`, with trace
    IDs when tracing is on (`log_trace_ids`)."""
    global _configured
    _configured = True
    structlog.configure(
        processors=_processors(),
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.WriteLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )


class StructlogEventSink:
    """`EventSink` writing each protocol event (section 9) as one JSON line: `event` plus
    `endpoint`, `message_id`, `attempt_id`, `partition` and the event's other fields.
    A full dead-letter queue, an inbox row that cannot be relayed and a dead letter the
    store refused as it came log at ERROR (an operator must act); dead letters, conflicts,
    retries and operators' actions on dead letters at WARNING; the rest at INFO."""

    _ERROR = frozenset({"dead_letter_queue.full", "inbox.dead_lettered",
                        "dead_letter.unstorable"})
    _WARN = frozenset({"message.dead_lettered", "transaction.conflict", "message.retried",
                       "dead_letter.replayed", "dead_letter.discarded", "inbox.relay_failed"})

    def __init__(self) -> None:
        self._log = structlog.get_logger("eo")

    def emit(self, event: str, **fields: object) -> None:
        if event in self._ERROR:
            self._log.error(event, **fields)
        elif event in self._WARN:
            self._log.warning(event, **fields)
        else:
            self._log.info(event, **fields)
