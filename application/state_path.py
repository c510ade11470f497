"""State-based processing: an event-sourced state stream per partition, no stored outputs.

One entry per processed message (written even when the handler changed nothing) carries the
message ID, the resulting state (a snapshot) and what the handler saw that is neither in the
message nor in the state (`Context.now`, `Context.attempt_id`). A duplicate is re-evaluated
against the state just before its own entry with the recorded context, so the handler, being
deterministic, yields the same decision; outgoing message IDs are derived
(`uuid5(incoming ID, "<endpoint>/<index>")`), so re-publication is byte-identical::

    state, version, entry = stream.load(P, m)        # entry: m's own entry, or None
    decision = handler(state, msg, context)          # recorded context for a duplicate
    if entry is None:
        stream.append(P, expected_version=version, m, decision.state, recorded)  # OCC
    publish(decision.outgoing)                       # always, and last
    ack

Limits (refused at start-up by the registry's validation, and at processing time with
`PermanentError`):

- outputs go only to receivers that deduplicate by message ID (`outbox` or `state`): no token
  is created for them, so a token-based receiver would drop them;
- no side effects with artifacts (blobs, HTTP calls, HTTP follow-ups, stored replies): their
  names are per attempt and they need registration before a commit this path does not have.

A state endpoint consumes no token: its senders create none for it (they know its strategy
from the registry), and it honours no protocol (`eo-*`) header of a delivery. The entry
records the message's digest too (type and body, `Envelope.digest`): a known message ID
with another type or body is dead-lettered (`MessageIdReused`), never re-evaluated as a
copy.

Retention (`StateRetention`) drops an entry once the entry after it is older than the window:
the latest snapshot always stays, and every entry inside the window keeps its predecessor, so
a duplicate inside the window is still evaluated against the right state. A duplicate whose
predecessor was dropped raises `OutsideRetention` (dead-lettered, never applied twice).
The port (`StateStream`) and its entries (`StateEntry`) live in application/ports/stores.py and
application/records.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from application.codec import encode
from application.envelope import TRACE_HEADERS, Envelope, lineage
from application.errors import Duplicate, MessageIdReused, PermanentError
from application.failpoints import NO_FAILPOINTS, Failpoints
from application.handler_runner import HandlerRunner
from application.locks import PartitionLocks
from application.observability import HANDLER_INVOKED, TRANSACTION_COMMITTED, attempt_fields
from application.ports import (
    Clock,
    EventSink,
    IdGenerator,
    MessageDispatcher,
    SpanKind,
    StateStream,
    Tracer,
)
from application.ports.null_tracer import NULL_TRACER, NullTracer
from domain.context import Context
from domain.decisions import Decision


def outgoing_id(incoming: uuid.UUID, endpoint: str, index: int) -> uuid.UUID:
    """The derived ID of output `index` of message `incoming` at `endpoint`."""
    return uuid.uuid5(incoming, f"{endpoint}/{index}")


def outgoing_envelopes(
    endpoint: str, incoming: Envelope, decision: Decision[Any], traced: bool = False
) -> list[tuple[str, Envelope]]:
    """(destination, envelope) of every output, with derived IDs, the lineage headers of
    `incoming` (as delivered: they are informational, see `application.envelope.lineage`)
    and no token header: identical bytes for identical decisions and deliveries. `traced`:
    they carry `incoming`'s trace context too (`TRACE_HEADERS`), not this attempt's, which
    a re-evaluated copy would not share."""
    headers = lineage(incoming)
    if traced:
        headers.update({name: value for name in TRACE_HEADERS
                        if (value := incoming.header(name)) is not None})
    chain = MappingProxyType(headers)
    return [(out.destination,
             Envelope(outgoing_id(incoming.message_id, endpoint, i), type(out.message).__name__,
                      encode(out.message), chain))
            for i, out in enumerate(decision.outgoing)]


def _record(context: Context, stored: Envelope) -> dict[str, Any]:
    return {"now": context.now.isoformat(), "attempt_id": str(context.attempt_id),
            "body_sha256": stored.body_sha256, "digest": stored.digest}


def _replayed(message_id: uuid.UUID, recorded: Mapping[str, Any]) -> Context:
    return Context(message_id=message_id, attempt_id=uuid.UUID(str(recorded["attempt_id"])),
                   now=datetime.fromisoformat(str(recorded["now"])))


def _refuse_artifacts(endpoint: str, decision: Decision[Any]) -> None:
    if (decision.blobs or decision.http_call is not None or decision.reply is not None
            or decision.api_call is not None):
        raise PermanentError(f"endpoint {endpoint} uses the state strategy: blobs, HTTP calls, "
                             "third-party API calls and replies are not available to it")


class StatePath:
    """The state strategy's processing of one delivery (see the module docstring).

    `attempt` returns when the message was applied now, and raises `Duplicate` for a
    duplicate (after re-publishing its outputs), `MessageIdReused` for a known ID with
    another body, and `Conflict` when another copy appended first (the processor retries,
    and the retry finds the duplicate).
    """

    def __init__(
        self,
        endpoint: str,
        runner: HandlerRunner,
        stream: StateStream,
        dispatcher: MessageDispatcher,
        clock: Clock,
        ids: IdGenerator,
        events: EventSink,
        failpoints: Failpoints = NO_FAILPOINTS,
        tracer: Tracer = NULL_TRACER,
    ) -> None:
        """`tracer`: a span per publication; where tracing is on (any tracer but
        `NULL_TRACER`), the outputs carry the incoming message's trace context
        (`outgoing_envelopes`)."""
        self.endpoint, self.runner, self.stream = endpoint, runner, stream
        self.dispatcher = dispatcher
        self.clock, self.ids, self.events = clock, ids, events
        self._hit = failpoints.hit
        self._tracer = tracer
        # what the outputs carry, not a cost: a trace context only where tracing is on
        self._traced = not isinstance(tracer, NullTracer)
        self._locks = PartitionLocks()

    async def _publish(self, destination: str, out: Envelope) -> None:
        with self._tracer.span("publish message", SpanKind.PRODUCER, {
                "messaging.destination.name": destination, "messaging.message.id": out.id_text,
                "messaging.operation.type": "send"}):
            await self.dispatcher.dispatch(destination, out)

    async def attempt(self, envelope: Envelope) -> None:
        """Process one delivery; see the class docstring."""
        name, m = self.endpoint, envelope.message_id
        stored = envelope.from_outside()
        message = self.runner.decode(stored)
        partition = self.runner.partition_of(message)
        async with self._locks.hold(partition):
            state, version, entry = await self.stream.load(partition, m)
            await self._hit("after_state_load")
            if entry is None:
                context = Context(message_id=m, attempt_id=self.ids(), now=self.clock.now())
                fields = attempt_fields(name, m, context.attempt_id, partition)
                self.events.emit(HANDLER_INVOKED, **fields)

                async def changed() -> bool:
                    # a copy that appended this very message, or any newer entry
                    _, now_version, mine = await self.stream.load(partition, m)
                    return mine is not None or now_version != version

                decision = await self.runner.decide(state, message, context, partition,
                                                    changed)
                _refuse_artifacts(name, decision)
                outgoing = outgoing_envelopes(name, envelope, decision, self._traced)
                await self._hit("before_append")
                await self.stream.append(partition, version, m, decision.state,
                                         _record(context, stored))
                self.events.emit(TRANSACTION_COMMITTED, **fields)
                await self._hit("after_append")
            else:  # a duplicate: the state before its entry, the context it saw then
                if not stored.same_message(entry.recorded.get("digest"),
                                           entry.recorded.get("body_sha256")):
                    raise MessageIdReused(m)  # not a copy: another message under m's ID
                decision = self.runner.handle(state, message, _replayed(m, entry.recorded))
                _refuse_artifacts(name, decision)
                outgoing = outgoing_envelopes(name, envelope, decision, self._traced)
            for destination, out in outgoing:
                await self._publish(destination, out)
            await self._hit("after_publish_all")
        if entry is not None:
            raise Duplicate


class StateRetention:
    """Retention of a state stream: `sweep()` truncates entries older than `window`
    (keeping the latest snapshot and each in-window entry's predecessor)."""

    def __init__(self, stream: StateStream, clock: Clock, window: timedelta) -> None:
        self.stream, self.clock, self.window = stream, clock, window

    async def sweep(self) -> int:
        """Truncate; returns how many entries were dropped."""
        return await self.stream.truncate(self.clock.now() - self.window)
