"""The batched token path: many deliveries of one endpoint as one unit of statements, with
per-message exactly-once semantics (protocol 3.1, co-located tokens; docs/batching.md).

A batch is processed in rounds. Round k holds the k-th message of each partition in the
batch (a later message of a partition waits for the round after: a transaction record
commits one transaction at a time), the partition as the delivery's body names it, and
costs, for all its messages together:

1. one read of the round's transaction records and states with their incoming tokens (the
   claim checks, in the same snapshot: the token check after the TR load of protocol 3.1 is
   that read); a delivery whose body is not its token's message goes singly, where the
   token's body decides,
2. the handlers,
3. one commit statement (every partition's state, TR and outgoing tokens, each guarded on its
   own version),
4. one finish: every output published, the publisher confirms awaited together, then one
   compare-and-clear statement that consumes every token and clears every TR.

Only the plain case is batched. A message whose processing needs anything else goes the
single-message path (`TransactionalPath.attempt`), which is exactly protocol 3.1: a delivery
without a token header, a body that does not decode or is not its token's message, an
unfinished transaction on its partition, a handler failure (the single path re-checks a
rejection), a decision with a blob or an HTTP call (registered artifacts), an HTTP
follow-up, a commit conflict. So do the later messages of its partition in the batch, to
keep their order. When a statement fails (PostgreSQL refusing one message's data fails it
for all, and so does a lost connection), the messages of that round and of the rounds behind
it go singly: each meets the error again alone, or not.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from application.envelope import REQUEST_URL_HEADER, TOKEN_HEADER, Envelope
from application.errors import Duplicate
from application.observability import (
    ATTEMPT_ABANDONED,
    HANDLER_INVOKED,
    TRANSACTION_COMMITTED,
    TRANSACTION_CONFLICT,
    attempt_fields,
)
from application.ports import CommitRequest, Loaded
from application.token_path import TokenPath
from domain.context import Context


class Singly:
    """A batch result: process this delivery on the single-message path."""

    def __repr__(self) -> str:
        return "SINGLY"


#: The batch result of a delivery the single-message path must process.
SINGLY = Singly()

#: A batch result per delivery: processed now (None), a `Duplicate`, or `SINGLY`.
BatchResult = None | Singly | BaseException


@dataclass(frozen=True)
class _Item:
    index: int
    delivery: Envelope  # as delivered: its token's message is what is processed
    message: Any
    partition: str


class TokenBatch:
    """Runs batches for one endpoint on the token path `path` (whose partition locks,
    handler, preparation and finisher it shares). Needs co-located tokens: the batch's
    commit inserts the outgoing tokens and its clear consumes the incoming ones. Build it
    with `application.assembly.build_processor`."""

    def __init__(self, path: TokenPath) -> None:
        if not path.colocated:
            raise ValueError("the batched token path needs co-located tokens")
        self.path = path

    async def run(self, envelopes: Sequence[Envelope]) -> list[BatchResult]:
        """One result per envelope, in order (see `BatchResult`); nothing is raised."""
        path = self.path
        results: list[BatchResult] = [SINGLY] * len(envelopes)
        rounds: dict[str, list[_Item]] = defaultdict(list)
        for i, delivery in enumerate(envelopes):
            if (delivery.header(TOKEN_HEADER) is None
                    or delivery.header(REQUEST_URL_HEADER) is not None):
                continue
            try:  # the partition as the delivery names it; the token's message decides
                message = path.runner.decode(delivery)
                partition = path.runner.partition_of(message)
            except Exception:  # noqa: BLE001 - the single path reads the token's body
                continue
            rounds[partition].append(_Item(i, delivery, message, partition))
        if not rounds:
            return results
        async with path.locks.hold_many(rounds):
            singly: set[str] = set()  # partitions whose remaining messages go singly
            depth = max(len(queue) for queue in rounds.values())
            for k in range(depth):
                todo = [q[k] for p, q in rounds.items() if len(q) > k and p not in singly]
                try:
                    await self._round(todo, results, singly)
                except Exception:  # noqa: BLE001 - each delivery meets it again alone, or not
                    # a statement failed: PostgreSQL refusing one message's data fails the
                    # whole statement, a lost connection fails it for all. Which message it
                    # was, if any, only the single path can tell: this round and the ones
                    # behind it go singly (an unfinished commit of theirs is finished there)
                    for item in (it for queue in rounds.values() for it in queue[k:]):
                        if not isinstance(results[item.index], Duplicate):
                            results[item.index] = SINGLY
                    break
        return results

    async def _round(self, todo: list[_Item], results: list[BatchResult],
                     singly: set[str]) -> None:
        """One round; a statement's error is raised after every attempt of the round that
        ran its handler and did not commit was logged as abandoned."""
        started: dict[int, tuple[_Item, uuid.UUID]] = {}  # item index -> its attempt
        try:
            await self._round_of(todo, results, singly, started)
        except Exception:
            for item, attempt in started.values():
                self._abandoned(item, attempt, "the batch's statement failed")
            raise

    def _abandoned(self, item: _Item, attempt: uuid.UUID, reason: str) -> None:
        self.path.events.emit(ATTEMPT_ABANDONED, endpoint=self.path.endpoint,
                              message_id=str(item.delivery.message_id),
                              attempt_id=str(attempt), partition=item.partition,
                              reason=f"{reason}: processed alone")

    async def _round_of(self, todo: list[_Item], results: list[BatchResult],
                        singly: set[str], started: dict[int, tuple[_Item, uuid.UUID]]
                        ) -> None:
        path = self.path
        if not todo:
            return
        loaded = await path.store.load_many([it.partition for it in todo],
                                            [it.delivery.message_id for it in todo])
        await path.hit("after_token_load")  # the tokens were read with the TRs
        await path.hit("after_tr_load")
        ready: list[tuple[_Item, Envelope, Loaded]] = []
        for item, load in zip(todo, loaded, strict=True):
            stored, delivery = load.token, item.delivery
            if stored is None:  # no token, in the TR's snapshot: a duplicate (protocol 3.1)
                results[item.index] = Duplicate()
            elif load.tr.message_id is not None:  # an unfinished transaction: 3.1 finishes it
                singly.add(item.partition)
            elif stored.type != delivery.type or stored.body != delivery.body:
                singly.add(item.partition)  # not the token's message: the token decides
            elif stored.header(REQUEST_URL_HEADER) is not None:  # whatever the delivery says
                singly.add(item.partition)  # an HTTP follow-up: the single path's
            else:
                ready.append((item, stored, load))
        await path.hit("after_token_check")
        requests: list[tuple[_Item, CommitRequest, dict[str, str]]] = []
        for item, stored, load in ready:
            attempt = path.ids()
            fields = attempt_fields(path.endpoint, stored.message_id, attempt, item.partition)
            request, reason = await self._decide(item, stored, load, attempt, fields)
            if request is None:
                self._abandoned(item, attempt, reason)
                singly.add(item.partition)
            else:
                started[item.index] = (item, attempt)
                requests.append((item, request, fields))
        await path.hit("after_handler")
        if not requests:
            return
        await path.hit("before_commit")
        committed = await path.store.commit_many([r for _, r, _ in requests])
        done = []
        for (item, request, fields), result in zip(requests, committed, strict=True):
            started.pop(item.index)  # committed or refused: ended either way
            if result is None:  # another attempt moved the partition: retried alone
                path.events.emit(TRANSACTION_CONFLICT, endpoint=path.endpoint,
                                 message_id=fields["message_id"], partition=item.partition,
                                 reason=f"partition {item.partition}: batch commit at "
                                        f"v{request.expected_version} refused")
                singly.add(item.partition)
                continue
            path.events.emit(TRANSACTION_COMMITTED, **fields)
            done.append((item, request, result, fields))
        await path.hit("after_commit")
        if not done:
            return
        await path.finisher.finish_many([(item.partition, request.message_id,
                                          request.attempt_id, result)
                                         for item, request, result, _ in done],
                                        [fields for _, _, _, fields in done])
        for item, _, _, _ in done:
            results[item.index] = None

    async def _decide(self, item: _Item, stored: Envelope, load: Loaded, attempt: uuid.UUID,
                      fields: dict[str, str]) -> tuple[CommitRequest | None, str]:
        """The handler's decision on the token's message `stored` as a commit request, or
        None and why the message needs the single path (a handler failure, a blob, an HTTP
        call). `fields`: the attempt's event fields."""
        path, m = self.path, stored.message_id
        context = Context(message_id=m, attempt_id=attempt, now=path.clock.now())
        path.events.emit(HANDLER_INVOKED, **fields)
        try:
            decision = path.runner.handle(load.state, item.message, context)
        except Exception as exc:  # noqa: BLE001 - the single path re-runs it, re-checking
            return None, f"the handler failed ({type(exc).__name__})"
        if decision.blobs or decision.http_call is not None:
            return None, "its decision has a blob or an HTTP call"
        prepared = await path.preparation.run(item.partition, load.tr.version, stored,
                                              attempt, decision)
        return CommitRequest(item.partition, prepared.version, decision.state, m, attempt,
                             prepared.records, decision.reply, None, prepared.tokens), ""
