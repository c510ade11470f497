"""Dead letters an operator can act on (protocol 7): the operations `eo dead-letters` and its
HTTP API run: list, show, replay, discard, and the retention that discards what nobody
acted on (what a dead-letter copy says is application/dead_letter_copies.py).

A dead letter keeps its token (the message may be processed after its cause is fixed), so
the operations are protocol-aware:

- **replay** republishes the message to its endpoint under the same message ID (and
  producer): processed once while its token exists (or, at a gateway, while no
  processed-message row claims it), dropped as a duplicate otherwise;
- **discard** releases what the message holds: registrations of its attempts on an idle
  transaction record are taken over (their artifacts deleted, as the sweeper's step 3
  does), a follow-up's request stored on a callee is deleted, and the token goes last, so
  nothing is left at rest; a message whose transaction is committed is refused (it was
  processed: its `finish` consumes the token);
- both hold the dead letter for the action (`DeadLetterStore.hold`): of two operators one
  acts and the other is told so; a replay racing a consumer's copy of the same message is
  a duplicate to the protocol. Each action is logged with who did it (and why, for a
  discard).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from application.api_caller import deadline_in
from application.envelope import REQUEST_URL_HEADER, Envelope
from application.errors import PermanentError
from application.handler_runner import HandlerRunner
from application.observability import DEAD_LETTER_DISCARDED, DEAD_LETTER_REPLAYED
from application.ports import (
    Clock,
    DeadLetterQuery,
    DeadLetterStore,
    EventSink,
    MessageDispatcher,
    TokenStore,
    TransactionalStore,
)
from application.records import Abandoned, DeadLetter, DeadLetterStatus, Kind
from application.side_effects import SideEffects
from application.sweeper import take_over_and_clean

#: The longest reason (`why`) a discard takes, in characters: it is logged with the action and
#: kept on the entry, for people to read; the bound keeps a paste or a hostile client from
#: filling the log and the store through it.
MAX_WHY_CHARS = 1000


def check_why(why: str) -> str:
    """`why`, a discard's reason, when it is one: raises ValueError when it is blank or
    longer than `MAX_WHY_CHARS` characters (the message names the limit and the length,
    never quotes the reason)."""
    if not why.strip():
        raise ValueError("a discard needs a reason (why)")
    if len(why) > MAX_WHY_CHARS:
        raise ValueError(f"a discard's reason (why) must be at most {MAX_WHY_CHARS} "
                         f"characters, not {len(why)}")
    return why


@dataclass(frozen=True)
class EndpointAccess:
    """What the operations need of one endpoint: its handler's decoding and partitioning
    (a discard finds the partition of the message's attempts), its transactional store, and
    whether its messages carry tokens (the `token` strategy)."""

    runner: HandlerRunner
    store: TransactionalStore
    tokens: bool


@dataclass(frozen=True)
class ActionResult:
    """What an operation did to one dead letter: `done` (replayed or discarded) or refused,
    and why, in words for the operator."""

    dead_letter_id: int
    done: bool
    detail: str


@dataclass(frozen=True)
class Gauges:
    """Dead letters per endpoint and status, and the tokens that dead letters keep (counted
    apart from the tokens in flight)."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    tokens: int = 0


class _Refused(Exception):
    """An action the dead letter's state does not allow; the message says why."""


class DeadLetters:
    """The operations on a service's dead letters (see the module docstring).

    - `endpoints`: the service's consuming endpoints (a dead letter of another is refused);
    - `effects`: deletes artifacts (a discard's taken-over registrations, a follow-up's
      stored request);
    - `grace`: the deferred clean-up's grace period (protocol 8), for what a discard takes
      over; `retention`: dead letters nobody acted on are discarded after it (`expire`).
    """

    def __init__(self, store: DeadLetterStore, tokens: TokenStore,
                 endpoints: Mapping[str, EndpointAccess], effects: SideEffects,
                 dispatcher: MessageDispatcher, clock: Clock, events: EventSink,
                 grace: timedelta, retention: timedelta) -> None:
        self.store, self.tokens, self.endpoints = store, tokens, dict(endpoints)
        self.effects, self.dispatcher = effects, dispatcher
        self.clock, self.events = clock, events
        self.grace, self.retention = grace, retention

    async def find(self, query: DeadLetterQuery) -> list[DeadLetter]:
        """The dead letters `query` selects, oldest first."""
        return await self.store.find(query)

    async def token_exists(self, letter: DeadLetter) -> bool | None:
        """Whether the message's token still exists (None: its endpoint has no tokens)."""
        if not self._has_tokens(letter) or letter.message_id is None:
            return None
        return await self.tokens.exists(letter.endpoint, letter.message_id)

    def _has_tokens(self, letter: DeadLetter) -> bool:
        access = self.endpoints.get(letter.endpoint)
        return access is not None and access.tokens and letter.message_id is not None

    async def _token(self, letter: DeadLetter) -> Envelope | None:
        """The message as its token holds it (what its sender committed), or None (no
        token, or its endpoint has none)."""
        if not self._has_tokens(letter) or letter.message_id is None:
            return None
        return await self.tokens.get(letter.endpoint, letter.message_id)

    async def replay(self, dead_letter_id: int, by: str) -> ActionResult:
        """Republish dead letter `dead_letter_id` to its endpoint (same message ID, headers
        but the copy's, producer), marked replayed by `by`. Refused when it is not `dead`,
        not replayable, or held by another operator. Raises `TransientError` when the
        broker or the store fails (the dead letter stays `dead`)."""
        async with self.store.hold(dead_letter_id) as held:
            if held is None:
                return _held_elsewhere(dead_letter_id)
            letter = held.letter
            try:
                self._check(letter)
                if not letter.replayable or letter.message_id is None or letter.type is None:
                    raise _Refused("its body was clipped (a malformed message, or one of no "
                                   "known type): it cannot be replayed; discard it")
                token = await self._token(letter)
                # the window its sender committed (the token's), never what the copy says:
                # a copy forged into a queue could claim any deadline
                deadline = deadline_in(letter.headers if token is None else token.headers)
                if deadline is not None and self.clock.now() >= deadline:
                    raise _Refused(f"idempotency window expired at {deadline.isoformat()}: "
                                   "its request to a third-party API can no longer be sent "
                                   "exactly once (the provider may have forgotten its key); "
                                   "discard it")
            except _Refused as exc:
                return ActionResult(dead_letter_id, False, str(exc))
            pending = None if not self._has_tokens(letter) else token is not None
            await self.dispatcher.dispatch(letter.endpoint, Envelope(
                letter.message_id, letter.type, letter.body, letter.headers, letter.producer))
            await held.replayed(by)
        self.events.emit(DEAD_LETTER_REPLAYED, endpoint=letter.endpoint,
                         message_id=str(letter.message_id), dead_letter_id=dead_letter_id,
                         by=by, token_exists=pending)
        detail = f"republished to {letter.endpoint}"
        if pending is False:
            detail += ("; its token is gone (processed or discarded meanwhile): the endpoint "
                       "drops it as a duplicate")
        return ActionResult(dead_letter_id, True, detail)

    async def discard(self, dead_letter_id: int, by: str, why: str) -> ActionResult:
        """Discard dead letter `dead_letter_id` for `why` (required), by `by`: release what
        its message holds (see the module docstring), then mark it discarded. Refused when
        it is not `dead`, its transaction is committed, or another operator holds it.
        Raises ValueError for a blank `why` or one over `MAX_WHY_CHARS` characters (before
        anything is released), `TransientError` when a store fails (what was released stays
        released; discarding again finishes the job)."""
        check_why(why)
        async with self.store.hold(dead_letter_id) as held:
            if held is None:
                return _held_elsewhere(dead_letter_id)
            letter = held.letter
            try:
                self._check(letter)
                released = await self._release(letter)
            except _Refused as exc:
                return ActionResult(dead_letter_id, False, str(exc))
            await held.discarded(by, why)
        self.events.emit(DEAD_LETTER_DISCARDED, endpoint=letter.endpoint,
                         message_id=str(letter.message_id or letter.raw_message_id),
                         dead_letter_id=dead_letter_id, type=letter.type, by=by, why=why,
                         released=released)
        return ActionResult(dead_letter_id, True,
                            "discarded" + (f"; released {', '.join(released)}" if released
                                           else ""))

    async def replay_many(self, query: DeadLetterQuery, by: str) -> list[ActionResult]:
        """`replay` for each dead letter `query` selects (only `dead` ones)."""
        return [await self.replay(d.dead_letter_id, by)
                for d in await self.store.find(_dead(query))]

    async def discard_many(self, query: DeadLetterQuery, by: str, why: str
                           ) -> list[ActionResult]:
        """`discard` for each dead letter `query` selects (only `dead` ones). Raises
        ValueError as `discard` for `why`, before any is discarded."""
        check_why(why)
        return [await self.discard(d.dead_letter_id, by, why)
                for d in await self.store.find(_dead(query))]

    async def expire(self) -> tuple[int, int]:
        """Retention: discard the `dead` ones last dead-lettered longer than `retention`
        ago (by "retention"), then purge the replayed and discarded ones acted on that long
        ago. Returns (discarded, purged)."""
        cutoff = self.clock.now() - self.retention
        why = f"not acted on within the retention of {self.retention.total_seconds():.0f} s"
        old = await self.store.find(DeadLetterQuery(before=cutoff, limit=1000))
        discarded = sum([(await self.discard(d.dead_letter_id, "retention", why)).done
                         for d in old])
        return discarded, await self.store.purge(cutoff)

    async def gauges(self) -> Gauges:
        """Dead letters per endpoint and status, and the tokens that `dead` ones keep."""
        kept = [(endpoint, m) for endpoint, m in await self.store.waiting()
                if (a := self.endpoints.get(endpoint)) is not None and a.tokens]
        return Gauges(await self.store.counts(), await self.tokens.count_of(kept))

    def _check(self, letter: DeadLetter) -> None:
        if letter.status is not DeadLetterStatus.DEAD:
            raise _Refused(f"it is {letter.status} already (by {letter.acted_by} at "
                           f"{letter.acted_at:%Y-%m-%d %H:%M:%S}Z)" if letter.acted_at
                           else f"it is {letter.status} already")
        if letter.endpoint not in self.endpoints:
            raise _Refused(f"{letter.endpoint} is not a consuming endpoint of this service")

    async def _release(self, letter: DeadLetter) -> list[str]:
        """Release what `letter`'s message holds; returns what was released, in words.
        Raises `_Refused` when its transaction is committed."""
        m = letter.message_id
        if m is None:
            return []
        access, released = self.endpoints[letter.endpoint], []
        token = await self.tokens.get(letter.endpoint, m) if access.tokens else None
        message = token or (Envelope(m, letter.type, letter.body) if letter.type else None)
        partition = None
        if message is not None:
            try:
                partition = access.runner.partition_of(access.runner.decode(message))
            except PermanentError:  # never processed: it registered nothing
                partition = None
        if partition is not None:
            tr, records = await access.store.load_tr_with_records(partition)
            if tr.message_id == m:
                raise _Refused(f"its transaction on partition {partition} is committed: it "
                               "was processed, and finishing it consumes its token (the "
                               "sweeper does, within EO_STALE_AFTER_S)")
            mine = tuple(r for r in records if r.incoming_id == m and not r.in_token)
            if mine and tr.message_id is None:
                if not await take_over_and_clean(
                        access.store, self.effects, self.events, letter.endpoint,
                        Abandoned(partition, tr.version, mine), self.clock.now() + self.grace,
                        discarded=True):
                    raise _Refused(f"partition {partition} moved while it was released: "
                                   "discard it again")
                released.append(f"{len(mine)} registration(s) of its attempts")
        if token is not None:
            url = token.header(REQUEST_URL_HEADER)
            if url is not None:  # a follow-up: what its commit would have deleted
                await self.effects.clean_up(Kind.HTTP_REQUEST, url, {})
                released.append("its stored HTTP request")
            await self.tokens.delete(letter.endpoint, m)
            released.append("its token")
        return released


def _dead(query: DeadLetterQuery) -> DeadLetterQuery:
    return DeadLetterQuery(query.endpoints, query.ids, DeadLetterStatus.DEAD, query.reason,
                           query.before, query.after, query.limit)


def _held_elsewhere(dead_letter_id: int) -> ActionResult:
    return ActionResult(dead_letter_id, False, "no such dead letter, or another operator is "
                        "acting on it now")

