"""structlog configuration and the event sink that logs protocol events as JSON lines."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure_logging(level: str = "INFO", stream: TextIO | None = None) -> None:
    """JSON lines with ISO timestamps on `stream` (stderr by default) at `level`."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.WriteLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )


class StructlogEventSink:
    """`EventSink` writing each protocol event (section 9) as one JSON line: `event` plus
    `endpoint`, `message_id`, `attempt_id`, `partition` and the event's other fields.
    A full dead-letter queue and an inbox row that cannot be relayed log at ERROR (an
    operator must act); dead letters, conflicts, retries and operators' actions on dead
    letters at WARNING; the rest at INFO."""

    _ERROR = frozenset({"dead_letter_queue.full", "inbox.dead_lettered"})
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
