"""`finish`: publish a committed transaction, clean up its losers, consume, clear (protocol 3.1)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from application.failpoints import Failpoints
from application.observability import SIDE_EFFECT_CLEANED, SIDE_EFFECT_PUBLISHED, TOKEN_CONSUMED
from application.ports import Clock, Committed, EventSink, IncomingTokens, PartitionStore
from application.records import Kind, SideEffectRecord
from application.side_effects import SideEffects

_KIND_ORDER = {kind: i for i, kind in enumerate(Kind)}


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
        tokens: IncomingTokens | None,
        effects: SideEffects,
        clock: Clock,
        events: EventSink,
        failpoints: Failpoints | None = None,
        cleanup_grace: timedelta = timedelta(minutes=30),
        colocated_tokens: bool = False,
    ) -> None:
        """`tokens`: the endpoint's own, consumed last (None on the outbox path, which
        consumes no token: its messages come with none); `colocated_tokens`: they are
        `store`'s token table, so consuming the token and clearing the TR are one statement
        (protocol 3.2's fast path)."""
        self._endpoint = endpoint
        self._store, self._tokens, self._clock, self._events = store, tokens, clock, events
        self.effects = effects
        self._fp = failpoints
        self._grace = cleanup_grace
        self._colocated = colocated_tokens and tokens is not None

    async def finish(self, partition: str, message_id: uuid.UUID, attempt_id: uuid.UUID,
                     committed: Committed | None = None) -> bool:
        """Finish (M, A) on `partition`. Returns False when someone else already finished it.

        `committed`: what the committer's own commit returned (version and records), which
        stands for the fenced read: the committer may skip it.
        """
        store, fp, ev = self._store, self._fp, self._events
        if committed is not None:
            version, records = committed.version, committed.records
        else:
            tr, records = await store.load_tr_with_records(partition)
            if (tr.message_id, tr.attempt_id) != (message_id, attempt_id):
                return False
            version = tr.version
        fields = {"endpoint": self._endpoint, "message_id": str(message_id),
                  "attempt_id": str(attempt_id), "partition": partition}
        winners = sorted((r for r in records if r.attempt_id == attempt_id), key=_order)
        aborted = sorted((r for r in records if r.attempt_id != attempt_id), key=_order)
        published = 0
        for rec in winners:
            if await self.effects.publish(rec.kind, rec.key, rec.payload):
                published += 1
                ev.emit(SIDE_EFFECT_PUBLISHED, kind=str(rec.kind), key=rec.key, **fields)
                if fp:
                    await fp.hit(f"after_publish:{published}")
        if fp:
            await fp.hit("after_publish_all")
        for rec in aborted:  # losers go before the token: I8 holds once the message is consumed
            await self.effects.clean_up(rec.kind, rec.key, rec.payload)
            ev.emit(SIDE_EFFECT_CLEANED, kind=str(rec.kind), key=rec.key,
                    loser_attempt_id=str(rec.attempt_id), **fields)
        if fp:
            await fp.hit("after_cleanup_aborted")
        due = self._clock.now() + self._grace
        if self._colocated:  # consume and clear in one transaction (3.2 fast path)
            await store.clear(partition, version, records, aborted, due, message_id)
            ev.emit(TOKEN_CONSUMED, **fields)
            if fp:
                await fp.hit("after_consume_token")
        else:
            if self._tokens is not None:
                await self._tokens.delete(message_id)  # consume: the last publication step
                ev.emit(TOKEN_CONSUMED, **fields)
            if fp:
                await fp.hit("after_consume_token")
            await store.clear(partition, version, records, aborted, due)
        if fp:
            await fp.hit("after_tr_clear")
        return True


def _order(rec: SideEffectRecord) -> tuple[int, str, int]:
    return (_KIND_ORDER[rec.kind], str(rec.attempt_id), rec.seq)
