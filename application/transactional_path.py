"""What the token path and the outbox path share: the partition's transaction (protocol 3.1):
settle what is committed, run the handler, prepare, commit, finish."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from application.envelope import Envelope
from application.errors import Duplicate
from application.failpoints import Failpoints
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
)
from application.preparation import Preparation, Prepared
from application.records import ProcessedMessage
from domain.context import Context


@dataclass(frozen=True)
class PathParts:
    """The collaborators a transactional path is made of (application/assembly.py builds
    them, each with only the ports it uses)."""

    endpoint: str
    runner: HandlerRunner
    store: PartitionStore
    preparation: Preparation
    finisher: Finisher
    caller: HttpCaller
    clock: Clock
    ids: IdGenerator
    events: EventSink
    failpoints: Failpoints | None = None


class TransactionalPath:
    """One attempt at a delivery on a strategy that commits through the transaction record
    (protocol 3.1). A subclass says how the message is loaded (`load`), how a duplicate is
    recognised after the TR load (`still_pending`), which token the TR load checks with it
    (`token_to_check`) and what the commit stores beyond the state (`processed_row`).

    `attempt` returns normally when the message was processed now and raises `Duplicate`,
    `Conflict` (the processor retries), `PermanentError` or `TransientError`.
    """

    def __init__(self, parts: PathParts) -> None:
        self.endpoint, self.runner, self.store = parts.endpoint, parts.runner, parts.store
        self.preparation, self.finisher, self.caller = (parts.preparation, parts.finisher,
                                                        parts.caller)
        self.clock, self.ids, self.events = parts.clock, parts.ids, parts.events
        self._fp = parts.failpoints
        #: this worker's partition locks (shared with its batched path)
        self.locks = PartitionLocks()

    async def hit(self, name: str) -> None:
        """Count a hit of failpoint `name` (nothing when none is configured)."""
        if self._fp:
            await self._fp.hit(name)

    async def load(self, envelope: Envelope) -> Envelope:
        """The delivery's message as this strategy trusts it; raises `Duplicate` when it is
        known to be one already."""
        raise NotImplementedError

    def token_to_check(self, message_id: uuid.UUID) -> uuid.UUID | None:
        """The token the TR load checks in the same read (co-located fast path), or None."""
        return None

    async def still_pending(self, stored: Envelope, loaded: Loaded) -> None:
        """The duplicate check after the TR load; raises `Duplicate`."""
        raise NotImplementedError

    def processed_row(self, stored: Envelope, partition: str,
                      prepared: Prepared) -> ProcessedMessage | None:
        """The processed-message row the commit writes (positive-proof path), or None."""
        return None

    async def attempt(self, envelope: Envelope) -> None:
        """One attempt at `envelope`; see the class docstring."""
        stored = await self.load(envelope)
        message = self.runner.decode(stored)
        partition = self.runner.partition_of(message)
        async with self.locks.hold(partition):
            await self._attempt_held(stored, message, partition)

    async def _attempt_held(self, stored: Envelope, message: Any, partition: str,
                            loaded: Loaded | None = None) -> None:
        """The attempt under `partition`'s lock, from the TR load on (`loaded`: that read,
        when the caller made it already): settle what is committed, re-check, run."""
        loaded = await self._settle_committed(partition, stored.message_id, loaded)
        await self.still_pending(stored, loaded)
        await self.hit("after_token_check")
        await self._run(stored, message, partition, loaded)

    async def _settle_committed(self, partition: str, m: uuid.UUID,
                                loaded: Loaded | None = None) -> Loaded:
        """Load the TR (with the state, and the token when co-located), unless `loaded` is
        that read already, and finish whatever transaction is committed on it (3.1)."""
        check = self.token_to_check(m)
        if loaded is None:
            loaded = await self.store.load(partition, check)
        await self.hit("after_tr_load")
        while (tr := loaded.tr).message_id is not None and tr.attempt_id is not None:
            await self.finisher.finish(partition, tr.message_id, tr.attempt_id)
            if tr.message_id == m:
                raise Duplicate  # it was ours: committed earlier, now finished
            loaded = await self.store.load(partition, check)
        return loaded

    async def _run(self, stored: Envelope, message: Any, partition: str, loaded: Loaded
                   ) -> None:
        name, m, tr = self.endpoint, stored.message_id, loaded.tr
        attempt = self.ids()
        response = await self.caller.follow_up_response(stored, partition)
        context = Context(message_id=m, attempt_id=attempt, now=self.clock.now(),
                          http_response=response)
        fields = attempt_fields(name, m, attempt, partition)
        self.events.emit(HANDLER_INVOKED, **fields)

        async def changed() -> bool:
            return (await self.store.load_tr(partition)).version != tr.version

        decision = await self.runner.decide(loaded.state, message, context, partition, changed)
        await self.hit("after_handler")
        prepared = await self.preparation.run(partition, tr.version, stored, attempt, decision)
        await self.hit("before_commit")
        committed = await self.store.commit(CommitRequest(
            partition, prepared.version, decision.state, m, attempt, prepared.records,
            decision.reply, self.processed_row(stored, partition, prepared), prepared.tokens))
        self.events.emit(TRANSACTION_COMMITTED, **fields)
        await self.hit("after_commit")
        # the commit returned what finish would read: nothing can add records while the TR
        # is committed, so the committer skips that read (a stale copy is fenced as usual)
        await self.finisher.finish(partition, m, attempt, committed, fields)
