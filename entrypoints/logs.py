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
#: the root logger's handler `configure_logging` added (the standard library's records)
_handler: logging.Handler | None = None


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


class _Stderr:
    """`sys.stderr` as it is at each write: a process's stderr can be swapped after logging
    is configured (a CLI runner's or a test runner's capture, closed once it is done), and
    a line written to the swapped-out one fails with `ValueError: I/O operation on closed
    file` in whatever code logged it (an HTTP callee answered 500)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "INFO", stream: TextIO | None = None) -> None:
    """JSON lines with ISO timestamps on `stream` (by default the process's stderr of the
    moment of each line, `sys.stderr`) at `level`, with trace
    IDs when tracing is on (`log_trace_ids`): structlog's events, and the standard library's
    records (the adapters', aio-pika's, asyncpg's: a lost connection, a reconnection) as
    the same JSON objects, their message as `event` and their logger as `logger`
    (structlog's `ProcessorFormatter` on a root handler of its own, which a second call
    replaces)."""
    global _configured, _handler
    _configured = True
    out: TextIO = stream or _Stderr()  # type: ignore[assignment]
    structlog.configure(
        processors=_processors(),
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    _handler = logging.StreamHandler(out)
    *chain, render = _processors()
    _handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *chain],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, render]))
    root.addHandler(_handler)
    root.setLevel(logging.getLevelName(level))
    for chatty in ("httpx", "httpcore"):  # a line per request at INFO: the metrics count them
        logging.getLogger(chatty).setLevel(max(logging.WARNING, root.level))


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
