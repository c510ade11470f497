"""An endpoint's dead-letter queue moved into the dead-letter store, where operators act on it
(application/dead_letters.py): what the consumer dead-lettered, what its source refused before
processing, and what the broker dead-lettered past the work queue's delivery limit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dispatcher import producer_of, text_headers
from adapters.rabbitmq.errors import PublishRefused, translated
from adapters.rabbitmq.topology import queue_names
from application.dead_letter_copies import dead_letter_of
from application.envelope import REASON_HEADER
from application.errors import TransientError
from application.observability import (
    DEAD_LETTER_QUEUE_FULL,
    DEAD_LETTER_QUEUE_ROOM,
    DEAD_LETTER_STORED,
    DEAD_LETTER_UNSTORABLE,
)
from application.ports import DeadLetterStore, EventSink
from application.records import DeadLetter

log = logging.getLogger(__name__)


class DeadLetterGate:
    """An endpoint's dead-letter queue as its source publishes to it, and the one place that
    handles it full: a copy the queue refuses (its byte bound, `reject-publish`) waits for
    room and is tried again every `wait_s` seconds, and while one waits the source takes no
    new delivery (`wait_for_room`; `blocked` for readiness). The first refusal emits
    `dead_letter_queue.full` (an ERROR), the first copy taken after it
    `dead_letter_queue.room` (to `events`, else the module's logger)."""

    def __init__(self, connection: RabbitConnection, endpoint: str, queue: str,
                 events: EventSink | None = None, wait_s: float = 5.0) -> None:
        self.connection, self.endpoint, self.queue = connection, endpoint, queue
        self.events, self.wait_s = events, wait_s
        self._room = asyncio.Event()  # cleared while the queue refuses copies
        self._room.set()

    @property
    def blocked(self) -> bool:
        """Whether a dead letter waits for room in the full queue."""
        return not self._room.is_set()

    async def publish(self, copy: aio_pika.Message, held: Callable[[], bool],
                      stopped: Callable[[], bool]) -> None:
        """Publish `copy` to the queue (confirmed), waiting while the queue refuses it.
        Raises `TransientError` when the broker fails, or when the original stops being
        `held()` (its channel lost) or the source has `stopped()` while waiting: the broker
        then redelivers the original."""
        while True:
            try:
                await self.connection.publish(self.queue, copy)
            except PublishRefused as exc:
                if self._room.is_set():
                    self._room.clear()
                    if self.events is not None:  # logged at ERROR by the service's sink
                        self.events.emit(DEAD_LETTER_QUEUE_FULL, endpoint=self.endpoint,
                                         queue=self.queue, reason=str(exc))
                    else:
                        log.error("the dead-letter queue of %s is full: %s", self.endpoint,
                                  exc)
                if stopped() or not held():
                    raise TransientError(f"{self.endpoint}: the dead-letter queue is full and "
                                         "the delivery is given back: the broker redelivers "
                                         "it") from exc
                await asyncio.sleep(self.wait_s)
                continue
            if not self._room.is_set():
                self._room.set()
                if self.events is not None:
                    self.events.emit(DEAD_LETTER_QUEUE_ROOM, endpoint=self.endpoint,
                                     queue=self.queue)
                else:
                    log.warning("the dead-letter queue of %s takes dead letters again",
                                self.endpoint)
            return

    async def wait_for_room(self, stopped: Callable[[], bool]) -> None:
        """Return once no dead letter waits for room, or the source has `stopped()`."""
        while self.blocked and not stopped():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), self.wait_s)


def broker_reason(headers: Mapping[str, Any] | None) -> str | None:
    """Why the broker dead-lettered a message itself, from its `x-death` header (None when
    it did not): past the quorum work queue's `x-delivery-limit`, the message was delivered
    that often without being settled (its processing kept killing or losing consumers)."""
    deaths = (headers or {}).get("x-death")
    if not deaths:
        return None
    death = deaths[0]
    reason = _text(death.get("reason"))
    queue = _text(death.get("queue"))
    if reason == "delivery_limit":
        return (f"delivery limit of {queue} reached: the message was delivered that often "
                "without being settled (its processing kept killing or losing consumers)")
    return f"dead-lettered by the broker from {queue}: {reason}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


def letter_of(message: AbstractIncomingMessage, endpoint: str, service_user: str | None
              ) -> DeadLetter:
    """The `DeadLetter` of a message of `endpoint`'s dead-letter queue (see
    `application.dead_letter_copies.dead_letter_of`); its producer by `producer_of`."""
    headers = text_headers(message.headers)
    at = message.timestamp.astimezone(UTC) if message.timestamp else datetime.now(UTC)
    return dead_letter_of(endpoint, message.message_id, message.type, message.body, headers,
                          producer_of(message.user_id, headers, service_user), at,
                          broker_reason(message.headers))


def plainest(message: AbstractIncomingMessage, endpoint: str, error: BaseException
             ) -> DeadLetter:
    """The dead letter of a message that could not be read or stored as it came (`error`):
    its body, message ID and type, every text as ASCII (`ascii`, so no store refuses it:
    what it shows is escaped), no header, not replayable, with a reason that says so."""
    message_id, type_ = message.message_id, message.type
    reason = (f"kept in its plainest form: the dead letter could not be kept as it came "
              f"({type(error).__name__}: {ascii(str(error))[1:-1][:500]})")
    return replace(dead_letter_of(
        endpoint, None if message_id is None else ascii(message_id)[1:-1],
        None if type_ is None else ascii(type_)[1:-1], message.body,
        {REASON_HEADER: reason}, "", datetime.now(UTC)), replayable=False)


class DeadLetterCollector:
    """Moves endpoint `endpoint`'s dead-letter queue into `store`, at least once: each
    message is kept (`DeadLetterStore.add`, idempotent for a copy kept before), then acked;
    a crash between the two keeps it twice, which the store merges. `collect()` takes up to
    `batch` messages with `basic.get` on a channel of its own (no consumer to supervise: the
    next round opens a new channel), so a lost connection only fails that round.

    No one entry stops collection: a message whatever its bytes becomes a dead letter any
    store can keep (`dead_letter_of` escapes what a store cannot hold); one that still
    cannot be read or kept as it came is kept in its `plainest` form, with a
    `dead_letter.unstorable` event (ERROR, counted in `eo_events_total`), and the rest of the
    queue is collected behind it. Only a store that fails every entry (down: a
    `TransientError`; or refusing even the plainest form) ends the round, the message in hand
    back at the head of the queue."""

    def __init__(self, connection: RabbitConnection, endpoint: str, store: DeadLetterStore,
                 service_user: str | None = None, events: EventSink | None = None,
                 batch: int = 500) -> None:
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self.connection, self.endpoint, self.store = connection, endpoint, store
        self.service_user, self.events, self.batch = service_user, events, batch
        self.queue = queue_names(endpoint).dead_letter

    async def collect(self) -> int:
        """One round; returns how many dead letters it moved. Raises `TransientError` when
        the broker or the store fails (those moved before stay moved; the message in hand
        goes back to the queue)."""
        moved = 0
        channel = await self.connection.open_channel(1)
        try:
            with translated(f"reading {self.queue!r}"):
                queue = await channel.declare_queue(self.queue, passive=True)
            while moved < self.batch:
                with translated(f"reading {self.queue!r}"):
                    message = await queue.get(no_ack=False, fail=False)
                if message is None:
                    break
                try:
                    letter, dead_letter_id = await self._keep(message)
                except Exception:
                    with translated(f"returning a dead letter to {self.queue!r}"):
                        await message.reject(requeue=True)
                    raise
                with translated(f"ack on {self.queue!r}"):
                    await message.ack()
                moved += 1
                if self.events is not None:
                    self.events.emit(DEAD_LETTER_STORED, endpoint=letter.endpoint,
                                     message_id=str(letter.message_id or
                                                    letter.raw_message_id),
                                     dead_letter_id=dead_letter_id, reason=letter.reason)
        finally:
            with translated(f"closing the channel of {self.queue!r}"):
                if not channel.is_closed:
                    await channel.close()
        return moved

    async def _keep(self, message: AbstractIncomingMessage) -> tuple[DeadLetter, int]:
        """Store `message`'s dead letter: as it came, else (it could not be read, or the
        store refused it for good) in its `plainest` form, with a `dead_letter.unstorable`
        event. Raises `TransientError` when the store fails (a retry may do), and what the
        store raised when it refused even the plainest form."""
        try:
            letter = letter_of(message, self.endpoint, self.service_user)
            return letter, await self.store.add(letter)
        except TransientError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever this one entry does, go on
            error: Exception = exc
        letter = plainest(message, self.endpoint, error)
        dead_letter_id = await self.store.add(letter)
        message_id = ascii(message.message_id)[1:-1] if message.message_id else None
        if self.events is not None:  # logged at ERROR by the service's sink
            self.events.emit(DEAD_LETTER_UNSTORABLE, endpoint=self.endpoint,
                             message_id=message_id, dead_letter_id=dead_letter_id,
                             error=f"{type(error).__name__}: {ascii(str(error))[1:-1][:500]}")
        else:
            log.error("a dead letter of %s could not be kept as it came (%s): kept as "
                      "dead letter %d in its plainest form", self.endpoint, error,
                      dead_letter_id)
        return letter, dead_letter_id

    async def drain(self) -> int:
        """Rounds until the queue is empty; returns how many dead letters moved."""
        total = 0
        while moved := await self.collect():
            total += moved
        return total
