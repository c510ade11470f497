"""The application's error types and what the consumer does with each (protocol 7)."""

from __future__ import annotations


class ProtocolError(Exception):
    """Base of the errors the processor raises; never raised itself."""


class Duplicate(ProtocolError):
    """The delivery turned out to be a duplicate (its token is gone, its processed-message row
    exists, or its transaction was committed earlier): the consumer acks it. Not an error of
    the message; raised inside processing to end an attempt early."""


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
    `replayable` is False for a message no replay can fix (malformed, of no known type): its
    dead letter carries a clipped body.
    """

    replayable = True

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnreadableState(PermanentError):
    """A partition's stored state does not decode into the endpoint's state type: the code
    changed in a way the states at rest do not fit (a field added without a default, a
    field's type changed; docs/upgrading.md, "Messages and states that change"). The
    message is fine: its dead letter keeps its body and token, and is replayed once the
    state type reads the stored states again."""


class MalformedMessage(PermanentError):
    """The body cannot be decoded into the message type it claims, or a header is missing."""

    replayable = False


class MessageIdReused(PermanentError):
    """A message ID already processed arrived with another body: not a copy of that message
    but another one under its ID (a producer's bug, or a forged pre-emptive send). Dead-
    lettered, never acked as a duplicate, so the message is not lost silently."""

    def __init__(self, message_id: object) -> None:
        super().__init__(f"message ID {message_id} reused with another body")


class UnknownMessageType(PermanentError):
    """The endpoint has no handler for the message's type."""

    replayable = False


class HandlerRejected(PermanentError):
    """The handler raised `domain.errors.Rejected`."""


class StateTooLarge(PermanentError):
    """The handler's new state of a partition is larger than the service allows
    (`EO_MAX_STATE_BYTES`): not committed, the message dead-lettered. A state that grows
    without bound through one partition slows every later message of it
    (docs/security.md)."""


class OutsideRetention(PermanentError):
    """A duplicate whose preceding state-stream entry was truncated by retention: it cannot
    be re-evaluated (state strategy), so it is dead-lettered, never applied twice."""


class Crash(BaseException):
    """Raised by a `crash` failpoint in tests that run workers as tasks, not processes.

    A BaseException so that no `except Exception` on the way can swallow it: the worker
    stops where it is, as a killed process would (no clean-up, no ack).
    """
