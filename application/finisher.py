"""`finish`: publish a committed transaction, clean up its losers, consume, clear (protocol 3.1)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from application import defaults
from application.consumption import Consumption
from application.failpoints import NO_FAILPOINTS, Failpoints
from application.observability import (
    SIDE_EFFECT_CLEANED,
    SIDE_EFFECT_PUBLISHED,
    TOKEN_CONSUMED,
    attempt_fields,
)
from application.ports import (
    Clear,
    Clock,
    Committed,
    EventSink,
    PartitionStore,
    SpanKind,
    Tracer,
)
from application.ports.null_tracer import NULL_TRACER
from application.records import Kind, SideEffectRecord
from application.side_effects import PUBLISHED_KINDS, SideEffects

_KIND_ORDER = {kind: i for i, kind in enumerate(Kind)}


@dataclass(frozen=True)
class _Plan:
    """Finishing one transaction: its message, event fields, winners and compare-and-clear."""

    message_id: uuid.UUID
    fields: dict[str, str]
    winners: list[SideEffectRecord]
    clear: Clear


class Finisher:
    """Completes the transaction committed to (message M, attempt A) on a partition.

    Safe to run concurrently from any number of workers (committer, redelivered copy, next
    message of the partition, sweeper) thanks to the two-sided fence: the TR and records are
    read together and acted on only if the TR is still committed to (M, A); the clear is a
    compare-and-clear on the version read. Every step is idempotent, so a crash anywhere in
    it is repaired by running it again.
    """

    def __init__(
        self,
        endpoint: str,
        store: PartitionStore,
        consumption: Consumption,
        effects: SideEffects,
        clock: Clock,
        events: EventSink,
        failpoints: Failpoints = NO_FAILPOINTS,
        cleanup_grace: timedelta = defaults.CLEANUP_GRACE,
        tracer: Tracer = NULL_TRACER,
    ) -> None:
        """`consumption`: how the endpoint's incoming token is consumed with the clear
        (application/consumption.py: by the clear itself, by a delete before it, or none on
        the outbox path), chosen by `application.assembly` from where the tokens live.
        `tracer`: a `finish` span, with a span per publication and clean-up in it."""
        self._endpoint = endpoint
        self._store, self._consumption = store, consumption
        self._clock, self._events = clock, events
        self.effects = effects
        self._fp = failpoints
        self._hit = failpoints.hit
        self._grace = cleanup_grace
        self._tracer = tracer

    async def finish(self, partition: str, message_id: uuid.UUID, attempt_id: uuid.UUID,
                     committed: Committed | None = None,
                     event_fields: dict[str, str] | None = None) -> bool:
        """Finish (M, A) on `partition`. Returns False when someone else already finished it.

        `committed`: what the committer's own commit returned (version and records), which
        stands for the fenced read: the committer may skip it. `event_fields`: the
        attempt's event fields (endpoint, message_id, attempt_id, partition) when the caller
        has them already.
        """
        if committed is None:
            tr, records = await self._store.load_tr_with_records(partition)
            if (tr.message_id, tr.attempt_id) != (message_id, attempt_id):
                return False
            committed = Committed(tr.version, tuple(records))
        [cleared] = await self._finish([self._plan(partition, message_id, attempt_id,
                                                   committed, event_fields)], batched=False)
        return cleared

    async def finish_many(self, done: Sequence[tuple[str, uuid.UUID, uuid.UUID, Committed]],
                          event_fields: Sequence[dict[str, str]] | None = None) -> list[bool]:
        """Finish transactions this worker has just committed, `(partition, M, A, committed)`
        each (the batched token path, co-located tokens only): the steps of `finish`, each
        for all of them together: every winner published (the messages of one transaction in
        order, the transactions together, their publisher confirms awaited at once), every
        loser cleaned up, then ONE compare-and-clear that consumes every token and clears
        every TR (`clear_many`). The failure table holds for each. Returns whether each
        cleared. `event_fields`: each transaction's event fields when the caller has them
        already. Raises ValueError unless tokens are co-located."""
        if not self._consumption.batches:
            raise ValueError("finish_many needs co-located tokens")
        return await self._finish([
            self._plan(partition, message_id, attempt_id, committed,
                       event_fields[i] if event_fields is not None else None)
            for i, (partition, message_id, attempt_id, committed) in enumerate(done)],
            batched=True)

    def _plan(self, partition: str, message_id: uuid.UUID, attempt_id: uuid.UUID,
              committed: Committed, event_fields: dict[str, str] | None) -> _Plan:
        """What finishing (M, A) does: its winners, its losers and its compare-and-clear
        (which consumes M's token in the same statement when tokens are co-located)."""
        fields = event_fields or attempt_fields(self._endpoint, message_id, attempt_id,
                                                partition)
        winners, aborted = _split(committed.records, attempt_id)
        clear = Clear(partition, committed.version, committed.records, aborted,
                      self._clock.now() + self._grace,
                      self._consumption.consumed_by_clear(message_id))
        return _Plan(message_id, fields, winners, clear)

    async def _finish(self, plans: Sequence[_Plan], batched: bool) -> list[bool]:
        """The steps of protocol 3.1's finish, each for every plan: publish, clean up the
        losers, consume, clear. `batched` (co-located tokens only): the publications run
        together and one `clear_many` consumes and clears them all; else there is one
        plan."""
        if self._tracer is NULL_TRACER:
            return await self._steps(plans, batched)
        with self._tracer.span("finish", attributes={"eo.transactions": len(plans)}):
            return await self._steps(plans, batched)

    async def _steps(self, plans: Sequence[_Plan], batched: bool) -> list[bool]:
        fp, ev = self._fp, self._events
        if not batched:
            await self._publish(plans[0].winners, plans[0].fields)
        else:
            outcomes = await asyncio.gather(*(self._publish(p.winners, p.fields) for p in plans),
                                            return_exceptions=True)
            for outcome in outcomes:  # every publication ended: raise the first failure
                if isinstance(outcome, BaseException):
                    raise outcome
        await fp.hit("after_publish_all")
        for plan in plans:
            await self._clean_up(plan.clear.aborted, plan.fields)
        await fp.hit("after_cleanup_aborted")
        cleared = await self._consumption.consume_and_clear(
            self._store, [p.clear for p in plans], [p.message_id for p in plans],
            lambda i: ev.emit(TOKEN_CONSUMED, **plans[i].fields), self._hit, batched)
        await fp.hit("after_tr_clear")
        return cleared

    async def _publish(self, winners: Sequence[SideEffectRecord], fields: dict[str, str]
                       ) -> None:
        fp, published = self._fp, 0
        for rec in winners:
            if self._tracer is NULL_TRACER or rec.kind not in PUBLISHED_KINDS:  # no span
                done = await self.effects.publish(rec.kind, rec.key, rec.payload)
            else:
                with self._tracer.span(f"publish {rec.kind}", _span_kind(rec),
                                       _attributes(rec)):
                    done = await self.effects.publish(rec.kind, rec.key, rec.payload)
            if done:
                published += 1
                self._events.emit(SIDE_EFFECT_PUBLISHED, kind=str(rec.kind), key=rec.key,
                                  **fields)
                await fp.hit(f"after_publish:{published}")

    async def _clean_up(self, aborted: Sequence[SideEffectRecord], fields: dict[str, str]
                        ) -> None:
        # losers go before the token: I8 holds once the message is consumed
        for rec in aborted:  # rare: an attempt lost
            with self._tracer.span(f"clean up {rec.kind}", attributes=_attributes(rec)):
                await self.effects.clean_up(rec.kind, rec.key, rec.payload)
            self._events.emit(SIDE_EFFECT_CLEANED, kind=str(rec.kind), key=rec.key,
                              loser_attempt_id=str(rec.attempt_id), **fields)


def _split(records: Sequence[SideEffectRecord], attempt_id: uuid.UUID
           ) -> tuple[list[SideEffectRecord], list[SideEffectRecord]]:
    """The records of attempt `attempt_id` (the winners) and the others (its losers'), each
    in publication order."""
    if len(records) == 1:  # the common case: one outgoing message, nothing to order
        [only] = records
        return ([only], []) if only.attempt_id == attempt_id else ([], [only])
    winners = sorted((r for r in records if r.attempt_id == attempt_id), key=_order)
    aborted = sorted((r for r in records if r.attempt_id != attempt_id), key=_order)
    return winners, aborted


def _span_kind(rec: SideEffectRecord) -> SpanKind:
    return SpanKind.PRODUCER if rec.kind is Kind.MESSAGE else SpanKind.INTERNAL


def _attributes(rec: SideEffectRecord) -> dict[str, str]:
    """A side effect's span attributes: a message's destination and ID (messaging semantic
    conventions), another kind's key (a blob's key, a request's URL)."""
    if rec.kind is Kind.MESSAGE:
        return {"messaging.destination.name": rec.payload.get("destination", ""),
                "messaging.message.id": rec.key, "messaging.operation.type": "send"}
    return {"eo.key": rec.key}


def _order(rec: SideEffectRecord) -> tuple[int, str, int]:
    return (_KIND_ORDER[rec.kind], str(rec.attempt_id), rec.seq)
