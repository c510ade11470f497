"""The application's error types and what the consumer does with each (protocol 7)."""

from __future__ import annotations


class ProtocolError(Exception):
    """Base of the errors the processor raises; never raised itself."""


class Conflict(ProtocolError):
    """An optimistic-concurrency check failed: another attempt changed the partition first.

    The attempt is abandoned; the processor retries at once a few times, re-checking the
    token first (protocol 7).
    """


class RequestDeleted(Conflict):
    """A PUT of this attempt's own, unique request URL met a tombstone (HTTP 410): the
    winner's clean-up deleted it while the attempt stalled, so the attempt lost. Retried as
    a conflict, the delivery then turns out to be a duplicate (protocol 6 and 7)."""


class TransientError(ProtocolError):
    """A failure that may pass on retry: connection lost, 5xx, conflicts retried too often.

    The consumer sends the delivery through delayed redelivery, up to the attempt limit.
    """


class PermanentError(ProtocolError):
    """A failure no retry can fix; the consumer dead-letters the delivery with `reason`.

    The token stays, so a message replayed from the dead-letter queue is processed normally.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MalformedMessage(PermanentError):
    """The body cannot be decoded into the message type it claims, or a header is missing."""


class UnknownMessageType(PermanentError):
    """The endpoint has no handler for the message's type."""


class HandlerRejected(PermanentError):
    """The handler raised `domain.errors.Rejected`."""


class Crash(BaseException):
    """Raised by a `crash` failpoint in tests that run workers as tasks, not processes.

    A BaseException so that no `except Exception` on the way can swallow it: the worker
    stops where it is, as a killed process would (no clean-up, no ack).
    """
