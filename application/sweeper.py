"""The sweeper (protocol 8): liveness for stuck transactions and hygiene for garbage."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from application import defaults
from application.finisher import Finisher
from application.observability import SIDE_EFFECT_CLEANED
from application.ports import Clock, EventSink, Inbox, RequestStore, SweeperQueries


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
            # the write fences the registering attempt out first: it can no longer commit
            if await self.store.take_over(abandoned, now + self.grace):
                for rec in abandoned.records:
                    await self.finisher.effects.clean_up(rec.kind, rec.key, rec.payload)
                    self.events.emit(SIDE_EFFECT_CLEANED, endpoint=self.endpoint,
                                     kind=str(rec.kind), key=rec.key, partition=rec.partition,
                                     abandoned=True)
                taken += 1
        purged = await self.store.purge_processed(now - self.retention)
        tombstones = 0
        if self.requests is not None:
            tombstones = await self.requests.purge_tombstones(now - self.retention)
        relayed = 0
        if self.inbox is not None:
            relayed = await self.inbox.purge_relayed(now - self.retention)
        return SweepReport(finished, cleaned, taken, purged, tombstones, relayed)
