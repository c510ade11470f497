"""The steps of an attempt that every transactional path composes (protocol 3.1): settle what
is committed on the partition, decide (the handler, with the rejection re-check), prepare,
commit, finish. The single-message paths (token_path.py, outbox_path.py) run them one
message at a time; the batched token path (token_batch.py) runs the same steps for many
messages, with one statement per step for all of them."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from application.envelope import Envelope
from application.errors import Conflict, Duplicate
from application.failpoints import NO_FAILPOINTS, Failpoints
from application.finisher import Finisher
from application.handler_runner import HandlerRunner
from application.http_caller import HttpCaller
from application.locks import PartitionLocks
from application.observability import HANDLER_INVOKED, TRANSACTION_COMMITTED, attempt_fields
from application.ports import (
    Clock,
    CommitRequest,
    EventSink,
    IdGenerator,
    Loaded,
    PartitionStore,
    Tracer,
)
from application.ports.null_tracer import NULL_TRACER
from application.preparation import Preparation, Prepared
from application.records import ProcessedMessage
from domain.context import Context, HttpResponse
from domain.decisions import Decision

#: What a commit stores beyond the state: the processed-message row of the outbox path
#: (positive proof), made from the message and its prepared outputs; None on the token path.
ProcessedRow = Callable[[Envelope, str, Prepared], ProcessedMessage]


@dataclass(frozen=True)
class PathParts:
    """The collaborators the steps are made of (application/assembly.py builds them, each
    with only the ports it uses)."""

    endpoint: str
    runner: HandlerRunner
    store: PartitionStore
    preparation: Preparation
    finisher: Finisher
    caller: HttpCaller
    clock: Clock
    ids: IdGenerator
    events: EventSink
    failpoints: Failpoints = NO_FAILPOINTS
    tracer: Tracer = NULL_TRACER


@dataclass(frozen=True)
class Attempt:
    """One attempt at a message, under its partition's lock and after its duplicate check:
    the message as the strategy trusts it (`stored`, and decoded), its partition, the TR
    load it was checked against, the attempt's ID and its event fields."""

    stored: Envelope
    message: Any
    partition: str
    loaded: Loaded
    attempt_id: uuid.UUID
    fields: dict[str, str]


class Steps:
    """The steps of one endpoint's worker (protocol 3.1), shared by its single and batched
    paths, with the worker's partition locks."""

    def __init__(self, parts: PathParts) -> None:
        self.endpoint, self.runner, self.store = parts.endpoint, parts.runner, parts.store
        self.preparation, self.finisher, self.caller = (parts.preparation, parts.finisher,
                                                        parts.caller)
        self.clock, self.ids, self.events = parts.clock, parts.ids, parts.events
        #: count a hit of failpoint `name` (nothing when none is configured)
        self.hit: Callable[[str], Awaitable[None]] = parts.failpoints.hit
        self.tracer = parts.tracer
        #: this worker's partition locks (its single and batched attempts share them)
        self.locks = PartitionLocks()

    async def settle_committed(self, partition: str, m: uuid.UUID,
                               check: uuid.UUID | None = None,
                               loaded: Loaded | None = None) -> Loaded:
        """Load the TR of `partition` with its state (and token `check`, read in the same
        snapshot, when tokens are co-located), unless `loaded` is that read already, and
        finish whatever transaction is committed on it (3.1). Raises `Duplicate` when that
        transaction was message `m`'s: committed earlier, finished now."""
        if loaded is None:
            loaded = await self.store.load(partition, check)
        await self.hit("after_tr_load")
        while (tr := loaded.tr).message_id is not None and tr.attempt_id is not None:
            await self.finisher.finish(partition, tr.message_id, tr.attempt_id)
            if tr.message_id == m:
                raise Duplicate  # it was ours: committed earlier, now finished
            loaded = await self.store.load(partition, check)
        return loaded

    def begin(self, stored: Envelope, message: Any, partition: str, loaded: Loaded) -> Attempt:
        """A new attempt at `stored` (a new attempt ID), checked against `loaded`."""
        attempt_id = self.ids()
        return Attempt(stored, message, partition, loaded, attempt_id,
                       attempt_fields(self.endpoint, stored.id_text, attempt_id, partition))

    async def decide(self, a: Attempt, response: HttpResponse | None = None,
                     recheck: bool = True) -> Decision[Any]:
        """The handler's decision for attempt `a` (`response`: an HTTP follow-up's). Raises
        what `HandlerRunner.handle` raises; with `recheck`, the rejection re-check
        (`HandlerRunner.decide`) first turns a failure on a state the partition has moved
        past into `Conflict`. The batched path does without: a failure sends the message
        to the single path, which re-checks."""
        context = Context(message_id=a.stored.message_id, attempt_id=a.attempt_id,
                          now=self.clock.now(), http_response=response)
        self.events.emit(HANDLER_INVOKED, **a.fields)
        if not recheck:
            return self.runner.handle(a.loaded.state, a.message, context)
        version = a.loaded.tr.version

        async def changed() -> bool:
            return (await self.store.load_tr(a.partition)).version != version

        return await self.runner.decide(a.loaded.state, a.message, context, a.partition,
                                        changed)

    async def prepare(self, a: Attempt, decision: Decision[Any],
                      processed_row: ProcessedRow | None = None) -> CommitRequest:
        """Register and create the decision's side effects (`Preparation`; raises
        `Conflict`) and return the commit that makes them the partition's."""
        prepared = await self.preparation.run(a.partition, a.loaded.tr.version, a.stored,
                                              a.attempt_id, decision)
        row = processed_row(a.stored, a.partition, prepared) if processed_row else None
        return CommitRequest(a.partition, prepared.version, decision.state,
                             a.stored.message_id, a.attempt_id, prepared.records,
                             decision.reply, row, prepared.tokens)

    async def run(self, stored: Envelope, message: Any, partition: str, loaded: Loaded,
                  processed_row: ProcessedRow | None = None) -> None:
        """One attempt at a message checked against `loaded`, from the handler to the
        finish: decide, prepare, commit, finish (in an `attempt` span). Raises `Conflict`
        when another attempt moved the partition first, `PermanentError` or
        `TransientError`."""
        a = self.begin(stored, message, partition, loaded)
        if self.tracer is NULL_TRACER:  # tracing off: no span to start, make current, end
            return await self._run(a, processed_row)
        span = self.tracer.start("attempt", attributes={
            "eo.attempt_id": a.fields["attempt_id"], "eo.partition": partition})
        try:
            with span.current():
                await self._run(a, processed_row)
        except Conflict as exc:  # the protocol at work, not a failure
            span.set("eo.outcome", "conflict")
            span.set("eo.reason", str(exc))
            span.end()
            raise
        except BaseException as exc:
            span.end(exc)
            raise
        span.end()
        return None

    async def _run(self, a: Attempt, processed_row: ProcessedRow | None) -> None:
        response = await self.caller.follow_up_response(a.stored, a.partition)
        decision = await self.decide(a, response)
        await self.hit("after_handler")
        request = await self.prepare(a, decision, processed_row)
        await self.hit("before_commit")
        if self.tracer is NULL_TRACER:
            committed = await self.store.commit(request)
        else:
            with self.tracer.span("commit", attributes={"eo.partition": a.partition}):
                committed = await self.store.commit(request)
        self.events.emit(TRANSACTION_COMMITTED, **a.fields)
        await self.hit("after_commit")
        # the commit returned what finish would read: nothing can add records while the TR
        # is committed, so the committer skips that read (a stale copy is fenced as usual)
        await self.finisher.finish(a.partition, a.stored.message_id, a.attempt_id, committed,
                                   a.fields)
