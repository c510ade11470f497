"""The sweeper (protocol 8): liveness for stuck transactions and hygiene for garbage."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from application import defaults
from application.finisher import Finisher
from application.observability import SIDE_EFFECT_CLEANED
from application.ports import Clock, EventSink, Inbox, RequestStore, SweeperQueries
from application.records import Abandoned
from application.side_effects import SideEffects


async def take_over_and_clean(store: SweeperQueries, effects: SideEffects, events: EventSink,
                              endpoint: str, registrations: Abandoned,
                              cleanup_due: datetime, **why: object) -> bool:
    """Take the abandoned `registrations` over and delete their artifacts: the take-over
    (`SweeperQueries.take_over`, one optimistic write that also lists them for deferred
    clean-up at `cleanup_due`) fences the registering attempt out first, so it can no
    longer commit, and only then is each artifact deleted and logged (`side_effect.cleaned`
    with the fields `why`, e.g. `abandoned=True`). Returns False, deleting nothing, when
    the partition moved meanwhile. The sweeper's step 3 and a dead letter's discard both
    release registrations this way. Raises `TransientError` when a store fails."""
    if not await store.take_over(registrations, cleanup_due):
        return False
    for rec in registrations.records:
        await effects.clean_up(rec.kind, rec.key, rec.payload)
        events.emit(SIDE_EFFECT_CLEANED, endpoint=endpoint, kind=str(rec.kind), key=rec.key,
                    partition=rec.partition, **why)
    return True


@dataclass(frozen=True)
class SweepReport:
    """Counts of one sweep: transactions finished, deferred clean-ups done, abandoned
    registrations taken over, processed-message rows, HTTP tombstones and relayed boundary
    inbox rows purged."""

    finished: int = 0
    deferred_cleaned: int = 0
    taken_over: int = 0
    purged_processed: int = 0
    purged_tombstones: int = 0
    purged_inbox: int = 0


class Sweeper:
    """One endpoint's sweeper; `sweep()` runs the four steps once, each safe to run
    concurrently with processing (every write is fenced or idempotent).

    - `stale_after`: a committed transaction older than this is finished (step 1);
    - `grace`: longer than any attempt can live; deferred clean-ups are due after it and
      registrations on an idle TR older than it are abandoned (steps 2, 3);
    - `retention`: processed-message rows, HTTP tombstones (with `requests`) and relayed
      rows of a boundary endpoint's inbox (with `inbox`) older than this are purged (step 4).
    """

    def __init__(
        self,
        endpoint: str,
        store: SweeperQueries,
        finisher: Finisher,
        clock: Clock,
        events: EventSink,
        stale_after: timedelta = defaults.STALE_AFTER,
        grace: timedelta = defaults.CLEANUP_GRACE,
        retention: timedelta = defaults.RETENTION,
        requests: RequestStore | None = None,
        inbox: Inbox | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.store = store
        self.finisher = finisher
        self.clock = clock
        self.events = events
        self.stale_after = stale_after
        self.grace = grace
        self.retention = retention
        self.requests = requests
        self.inbox = inbox

    async def sweep(self) -> SweepReport:
        """Run steps 1-4 once and report what each did."""
        now = self.clock.now()
        finished = 0
        for tr in await self.store.committed_before(now - self.stale_after):
            if tr.message_id is not None and tr.attempt_id is not None:
                finished += await self.finisher.finish(tr.partition, tr.message_id, tr.attempt_id)
        cleaned = 0
        due = await self.store.due_cleanups(now)
        for item in due:
            await self.finisher.effects.clean_up(item.kind, item.key, item.payload)
            self.events.emit(SIDE_EFFECT_CLEANED, endpoint=self.endpoint, kind=str(item.kind),
                             key=item.key, deferred=True)
            cleaned += 1
        await self.store.drop_cleanups([item.cleanup_id for item in due])
        taken = 0
        for abandoned in await self.store.abandoned(now - self.grace):
            taken += await take_over_and_clean(self.store, self.finisher.effects, self.events,
                                               self.endpoint, abandoned, now + self.grace,
                                               abandoned=True)
        purged = await self.store.purge_processed(now - self.retention)
        tombstones = 0
        if self.requests is not None:
            tombstones = await self.requests.purge_tombstones(now - self.retention)
        relayed = 0
        if self.inbox is not None:
            relayed = await self.inbox.purge_relayed(now - self.retention)
        return SweepReport(finished, cleaned, taken, purged, tombstones, relayed)
