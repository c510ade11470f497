"""Which errors of the AMQP driver (aio-pika, aiormq, pamqp) are transient, which are the
broker's refusals that no wait fixes, and the errors the RabbitMQ adapters raise themselves.

A plain `RuntimeError` is not transient: it is a programming error, and retrying it as if the
broker were away only delays its report. The drivers use it for one transient condition that
the connection's code reaches: aiormq's (7.2) `Connection.channel` raises
`RuntimeError("<Connection ...> closed")` when the connection closed while the channel was
opening (it waits for the connection to be ready first); `RabbitConnection` re-raises that one
as `ClosedWhileOpening` (`closed_while_opening`). aiormq's own
`ChannelInvalidStateError` (a `RuntimeError` too: a closed channel) is named by its type.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import pamqp.exceptions
from aio_pika.abc import AbstractConnection
from aio_pika.exceptions import (
    AMQPError,
    ChannelInvalidStateError,
    ChannelPreconditionFailed,
    ProbableAuthenticationError,
)
from aiormq.exceptions import ChannelAccessRefused  # aio-pika does not re-export it

from application.errors import TransientError

#: Driver errors that mean "the broker or the network failed, try again later". asyncio's
#: TimeoutError is the builtin one on 3.11 (an OSError); both are named for clarity.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    AMQPError, ChannelInvalidStateError, pamqp.exceptions.PAMQPException, ConnectionError,
    OSError, asyncio.TimeoutError,
)
#: Broker refusals that no wait fixes: the credentials (ACCESS_REFUSED at login), an
#: operation the user has no permission for, a queue that exists with other arguments
#: (PRECONDITION_FAILED). A virtual host the user may not open is not one of them: a revoked
#: permission, or a deployment that has created the user but not yet its rights, looks so.
REFUSALS: tuple[type[BaseException], ...] = (
    ProbableAuthenticationError, ChannelAccessRefused, ChannelPreconditionFailed,
)


class ClosedWhileOpening(ConnectionError):
    """The connection closed while a channel was opening on it (aiormq says so with a plain
    `RuntimeError`, see the module docstring): one of `DRIVER_ERRORS`, as a `ConnectionError`."""


class PublishRefused(TransientError):
    """The broker nacked a publish: the queue refused it (a bound with `reject-publish`
    reached, as on the dead-letter queues) or the broker failed to store it."""


class BrokerUnavailable(TransientError):
    """The broker could not be reached, or a queue not consumed, for longer than the
    give-up time: the process should exit and let its orchestrator restart it."""


def closed_without_reason(error: BaseException) -> bool:
    """Whether `error` is aiormq's bare `Exception`: what it fails a pending frame or RPC
    with (a channel opening, an ack being written) when its channel or connection closes
    without a reason (aiormq's FutureStore rejects them with `Exception`). Seen in `eo
    chaos --production`: a consumer's watchdog opening a channel as a paused node's
    connection closed, and an ack under a `drop_conn`; it is a lost connection."""
    return type(error) is Exception


def channel_gone(error: BaseException) -> bool:
    """Whether `error` says the channel or connection is gone: one of `DRIVER_ERRORS`, or
    aiormq's bare `Exception` (`closed_without_reason`). For the places that catch a lost
    channel without `translated` (a requeue, a cancel: the broker has done it already)."""
    return isinstance(error, DRIVER_ERRORS) or closed_without_reason(error)


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Re-raise `DRIVER_ERRORS` of the block, and aiormq's bare `Exception` of a closed
    connection (`closed_without_reason`), as `TransientError("<what>: <error>")`; any other
    error (a `RuntimeError` among them) propagates as it is."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise TransientError(f"{what}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        if not closed_without_reason(exc):
            raise
        raise TransientError(f"{what}: the connection closed") from exc


def refusal(error: BaseException) -> BaseException | None:
    """The broker's refusal (one of `REFUSALS`) that `error` is or was raised from (its
    `__cause__` / `__context__` chain), None when there is none: waiting may fix `error`."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, REFUSALS):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def alive(connection: AbstractConnection | None) -> bool:
    """Whether aio-pika `connection` (None: none) and its AMQP transport are open (aio-pika
    may not have noticed yet that the transport closed)."""
    if connection is None or connection.is_closed:
        return False
    transport = getattr(connection, "transport", None)  # aio-pika's UnderlayConnection
    return transport is not None and not transport.connection.is_closed


@contextmanager
def closed_while_opening(connection: AbstractConnection | None) -> Iterator[None]:
    """Around the opening of a channel on aio-pika `connection`: aiormq's
    `RuntimeError("<Connection ...> closed")` re-raised as `ClosedWhileOpening` when the
    connection is indeed closed now. Any other `RuntimeError`, or one on a connection still
    open, is a bug and propagates as it is."""
    try:
        yield
    except RuntimeError as exc:
        if isinstance(exc, DRIVER_ERRORS) or alive(connection):
            raise
        raise ClosedWhileOpening(f"the connection closed while a channel opened: {exc}"
                                 ) from exc
