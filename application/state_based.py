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
    tokens.delete(m)                                 # when the sender was token-based
    ack

Limits (refused at start-up by `state_wiring_errors`, and at processing time with
`PermanentError`):

- outputs go only to receivers that deduplicate by message ID (`outbox` or `state`): no token
  is created for them, so a token-based receiver would drop them;
- no side effects with artifacts (blobs, HTTP calls, HTTP follow-ups, stored replies): their
  names are per attempt and they need registration before a commit this path does not have.

A state endpoint may receive from token-based senders: it reads the body from the token
(claim check), deduplicates by its stream, and deletes the token after the append and the
publication, so no token is left behind.

Retention (`StateRetention`) drops an entry once the entry after it is older than the window:
the latest snapshot always stays, and every entry inside the window keeps its predecessor, so
a duplicate inside the window is still evaluated against the right state. A duplicate whose
predecessor was dropped raises `OutsideRetention` (dead-lettered, never applied twice).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from application.codec import encode
from application.envelope import REQUEST_URL_HEADER, TOKEN_HEADER, Envelope
from application.errors import Conflict, PermanentError
from application.failpoints import Failpoints
from application.locks import PartitionLocks
from application.observability import HANDLER_INVOKED, TOKEN_CONSUMED, TRANSACTION_COMMITTED
from application.ports import Clock
from domain.context import Context
from domain.decisions import Decision, Endpoint

if TYPE_CHECKING:
    from application.processor import Ports

#: Strategy names (the values of `application.processor.Strategy`).
STATE = "state"
#: Strategies whose receivers drop copies by message ID alone (no token needed).
DEDUPLICATE_BY_ID = frozenset({"outbox", "state"})


class OutsideRetention(PermanentError):
    """A duplicate whose preceding entry was truncated: it cannot be re-evaluated."""


@dataclass(frozen=True)
class StateEntry:
    """One entry of a partition's stream: the message applied at `version` (1, 2, ...), the
    state after it, and the context recorded at its first processing."""

    partition: str
    version: int
    message_id: uuid.UUID
    state: Any
    recorded: Mapping[str, Any]
    appended_at: datetime


class StateStream(Protocol):
    """An append-only stream of state snapshots per partition, for one endpoint.

    Every method is one atomic read or write. Raises `TransientError` when unreachable.
    """

    async def load(
        self, partition: str, message_id: uuid.UUID
    ) -> tuple[Any, int, StateEntry | None]:
        """One consistent read. When `message_id` has no entry: (newest state or None,
        newest version or 0, None). Otherwise: (the state just before that entry, its
        version - 1, the entry); raises `OutsideRetention` when that earlier entry was
        truncated."""

    async def append(
        self,
        partition: str,
        expected_version: int,
        message_id: uuid.UUID,
        state: Any,
        recorded: Mapping[str, Any],
    ) -> int:
        """Append entry `expected_version + 1`, only while the newest version is
        `expected_version` and `message_id` has no entry; returns the new version, raises
        `Conflict` otherwise."""

    async def truncate(self, before: datetime) -> int:
        """Drop every entry whose next entry was appended before `before` (the newest entry
        of a partition always stays). Returns how many were dropped."""


def outgoing_id(incoming: uuid.UUID, endpoint: str, index: int) -> uuid.UUID:
    """The derived ID of output `index` of message `incoming` at `endpoint`."""
    return uuid.uuid5(incoming, f"{endpoint}/{index}")


def outgoing_envelopes(
    endpoint: str, incoming: uuid.UUID, decision: Decision[Any]
) -> list[tuple[str, Envelope]]:
    """(destination, envelope) of every output, with derived IDs and no token header:
    identical bytes for identical decisions."""
    return [(out.destination,
             Envelope(outgoing_id(incoming, endpoint, i), type(out.message).__name__,
                      encode(out.message), MappingProxyType({})))
            for i, out in enumerate(decision.outgoing)]


def _record(context: Context) -> dict[str, Any]:
    return {"now": context.now.isoformat(), "attempt_id": str(context.attempt_id)}


def _replayed(message_id: uuid.UUID, recorded: Mapping[str, Any]) -> Context:
    return Context(message_id=message_id, attempt_id=uuid.UUID(str(recorded["attempt_id"])),
                   now=datetime.fromisoformat(str(recorded["now"])))


def _refuse_artifacts(endpoint: str, decision: Decision[Any]) -> None:
    if decision.blobs or decision.http_call is not None or decision.reply is not None:
        raise PermanentError(f"endpoint {endpoint} uses the state strategy: blobs, HTTP calls "
                             "and replies are not available to it")


class StateBasedProcessing:
    """The state strategy's processing of one delivery (see the module docstring).

    `decode(envelope)` and `handle(state, message, context)` are the processor's (errors
    mapped to `PermanentError`). `attempt` returns True when the message was applied now,
    False for a duplicate (whose outputs it re-published); raises `Conflict` when another
    copy appended first (the processor retries, and the retry finds the duplicate).
    """

    def __init__(
        self,
        endpoint: Endpoint[Any],
        ports: Ports,
        decode: Callable[[Envelope], Any],
        handle: Callable[[Any, Any, Context], Decision[Any]],
        failpoints: Failpoints | None = None,
    ) -> None:
        if ports.state_stream is None:
            raise ValueError(f"endpoint {endpoint.name}: the state strategy needs a state stream")
        self.endpoint, self.ports = endpoint, ports
        self.stream: StateStream = ports.state_stream
        self._decode, self._handle, self._fp = decode, handle, failpoints
        self._locks = PartitionLocks()

    async def _hit(self, name: str) -> None:
        if self._fp:
            await self._fp.hit(name)

    async def attempt(self, envelope: Envelope) -> bool:
        """Process one delivery; see the class docstring."""
        ports, name, m = self.ports, self.endpoint.name, envelope.message_id
        if envelope.header(REQUEST_URL_HEADER) is not None:
            raise PermanentError(f"endpoint {name} uses the state strategy: no HTTP follow-ups")
        tokened = envelope.header(TOKEN_HEADER) is not None
        stored = envelope
        if tokened:  # a token-based sender: the body lives in the token (claim check)
            found = await ports.tokens.get(m)
            if found is None:  # consumed: appended and published before
                return False
            stored = found
        message = self._decode(stored)
        partition = self.endpoint.partition_of(message)
        async with self._locks.hold(partition):
            state, version, entry = await self.stream.load(partition, m)
            await self._hit("after_state_load")
            if entry is None:
                context = Context(message_id=m, attempt_id=ports.ids(), now=ports.clock.now())
                ports.events.emit(HANDLER_INVOKED, endpoint=name, message_id=str(m),
                                  attempt_id=str(context.attempt_id), partition=partition)
                decision = await self._decide(partition, version, state, message, context)
                outgoing = outgoing_envelopes(name, m, decision)
                await self._hit("before_append")
                await self.stream.append(partition, version, m, decision.state,
                                         _record(context))
                ports.events.emit(TRANSACTION_COMMITTED, endpoint=name, message_id=str(m),
                                  attempt_id=str(context.attempt_id), partition=partition)
                await self._hit("after_append")
            else:  # a duplicate: the state before its entry, the context it saw then
                decision = self._handle(state, message, _replayed(m, entry.recorded))
                _refuse_artifacts(name, decision)
                outgoing = outgoing_envelopes(name, m, decision)
            for destination, out in outgoing:
                await ports.dispatcher.dispatch(destination, out)
            await self._hit("after_publish_all")
            if tokened:
                await ports.tokens.delete(m)
                ports.events.emit(TOKEN_CONSUMED, endpoint=name, message_id=str(m),
                                  partition=partition)
                await self._hit("after_consume_token")
        return entry is None

    async def _decide(self, partition: str, version: int, state: Any, message: Any,
                      context: Context) -> Decision[Any]:
        try:
            decision = self._handle(state, message, context)
        except PermanentError:
            # a rejection judged on a state another copy has since replaced (maybe by
            # appending this very message) is a conflict, not a verdict
            _, now_version, entry = await self.stream.load(partition, context.message_id)
            if entry is not None or now_version != version:
                raise Conflict(f"partition {partition} changed while the handler ran") from None
            raise
        _refuse_artifacts(self.endpoint.name, decision)
        return decision


class StateRetention:
    """Retention of a state stream: `sweep()` truncates entries older than `window`
    (keeping the latest snapshot and each in-window entry's predecessor)."""

    def __init__(self, stream: StateStream, clock: Clock, window: timedelta) -> None:
        self.stream, self.clock, self.window = stream, clock, window

    async def sweep(self) -> int:
        """Truncate; returns how many entries were dropped."""
        return await self.stream.truncate(self.clock.now() - self.window)


def state_wiring_errors(
    endpoints: Mapping[str, Endpoint[Any]],
    strategies: Mapping[str, str],
    uses_artifacts: Collection[str],
    default: str = "token",
) -> list[str]:
    """Why this configuration cannot run state endpoints (empty when it can): a state
    endpoint sending to a receiver that needs tokens, or one whose handler uses artifacts
    (blobs, HTTP). `strategies` maps endpoint names to strategy names."""
    errors = []
    for name, strategy in sorted(strategies.items()):
        if str(strategy) != STATE:
            continue
        if name in uses_artifacts:
            errors.append(f"{name}=state: its handler creates blobs or calls HTTP services, "
                          "which the state strategy does not support")
        endpoint = endpoints.get(name)
        for receiver in endpoint.outputs if endpoint is not None else ():
            used = str(strategies.get(receiver, default))
            if used not in DEDUPLICATE_BY_ID:
                errors.append(f"{name}=state sends to {receiver}, which uses {used!r}: a state "
                              "endpoint's outputs carry no token, so every receiver must use "
                              "'outbox' or 'state'")
    return errors
