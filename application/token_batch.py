"""The batched token path: many deliveries of one endpoint as one unit of statements, with
per-message exactly-once semantics (protocol 3.1, co-located tokens; docs/batching.md).

The batch composes the same steps as the single path (application/transactional_path.py:
`Steps.begin`, `decide`, `prepare`), with one statement per step for all its messages where
it pays off (`load_many`, `commit_many`, `Finisher.finish_many`). A batch is processed in
rounds. Round k holds the k-th message of each partition in the
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
single-message path (`TokenPath.attempt`), which is exactly protocol 3.1: a delivery
without a token header, a body that does not decode or is not its token's message, an
unfinished transaction on its partition, a handler failure (the single path re-checks a
rejection), a decision with a blob or an HTTP call (registered artifacts), an HTTP
follow-up, a commit conflict. So do the later messages of its partition in the batch, to
keep their order. When a statement fails (PostgreSQL refusing one message's data fails it
for all, and so does a lost connection), the messages of that round and of the rounds behind
it go singly: each meets the error again alone, or not.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from application.claim_check import is_the_delivery
from application.envelope import API_CALL_HEADER, REQUEST_URL_HEADER, TOKEN_HEADER, Envelope
from application.observability import (
    ATTEMPT_ABANDONED,
    MESSAGE_DUPLICATE,
    TRANSACTION_COMMITTED,
    TRANSACTION_CONFLICT,
    message_attributes,
)
from application.outcome import Outcome
from application.ports import CommitRequest, Loaded, Span, SpanKind
from application.ports.null_tracer import NULL_TRACER
from application.transactional_path import Attempt, Steps

#: What a batch settled: an outcome or an error per index of its deliveries; the deliveries
#: it did not settle go to the single path.
Settled = dict[int, Outcome | BaseException]


def is_follow_up(envelope: Envelope) -> bool:
    """Whether `envelope` (a delivery, or the message its token holds) is the follow-up of
    an HTTP call or of a third-party API call: its response is collected, or its request
    sent, by the single path only (`HttpCaller.follow_up_response`), so the batch leaves it
    there. The batch asks it of the delivery when it forms its rounds and of the token's
    message once it has read it (the token's message decides, whatever the delivery
    says)."""
    headers = envelope.headers  # asked twice a message: no `header` calls
    return REQUEST_URL_HEADER in headers or API_CALL_HEADER in headers


@dataclass(frozen=True)
class _Item:
    index: int
    delivery: Envelope  # as delivered: its token's message is what is processed
    message: Any
    partition: str


class TokenBatch:
    """Runs batches for one endpoint on the shared steps `steps` (whose partition locks,
    handler, preparation and finisher the single path uses too). Needs co-located tokens:
    the batch's commit inserts the outgoing tokens and its clear consumes the incoming ones.
    Build it with `application.assembly.build_processor`."""

    def __init__(self, steps: Steps) -> None:
        self.steps = steps

    async def run(self, envelopes: Sequence[Envelope]) -> Settled:
        """What the batch settled, by index in `envelopes` (`Outcome.PROCESSED` or
        `Outcome.DUPLICATE`); the other indexes go to the single path. Nothing is
        raised."""
        steps = self.steps
        settled: Settled = {}
        rounds: dict[str, list[_Item]] = defaultdict(list)
        for i, delivery in enumerate(envelopes):
            if delivery.header(TOKEN_HEADER) is None or is_follow_up(delivery):
                continue
            try:  # the partition as the delivery names it; the token's message decides
                message = steps.runner.decode(delivery)
                partition = steps.runner.partition_of(message)
            except Exception:  # noqa: BLE001 - the single path reads the token's body
                continue
            rounds[partition].append(_Item(i, delivery, message, partition))
        if not rounds:
            return settled
        async with steps.locks.hold_many(rounds):
            singly: set[str] = set()  # partitions whose remaining messages go singly
            depth = max(len(queue) for queue in rounds.values())
            for k in range(depth):
                todo = [q[k] for p, q in rounds.items() if len(q) > k and p not in singly]
                try:
                    await self._round(todo, settled, singly)
                except Exception:  # noqa: BLE001 - each delivery meets it again alone, or not
                    # a statement failed: PostgreSQL refusing one message's data fails the
                    # whole statement, a lost connection fails it for all. Which message it
                    # was, if any, only the single path can tell: this round and the ones
                    # behind it go singly (an unfinished commit of theirs is finished there)
                    for item in (it for queue in rounds.values() for it in queue[k:]):
                        if settled.get(item.index) is not Outcome.DUPLICATE:
                            settled.pop(item.index, None)
                    break
        return settled

    async def _round(self, todo: list[_Item], settled: Settled, singly: set[str]) -> None:
        """One round; a statement's error is raised after every attempt of the round that
        ran its handler and did not commit was logged as abandoned."""
        started: dict[int, Attempt] = {}  # item index -> its attempt
        spans: dict[int, Span] = {}  # item index -> its message's span
        try:
            await self._round_of(todo, settled, singly, started, spans)
        except Exception as exc:
            for a in started.values():
                self._abandoned(a, "the batch's statement failed")
            for span in spans.values():
                span.end(exc)
            raise

    @staticmethod
    def _ended(spans: dict[int, Span], index: int, outcome: str) -> None:
        """End the span of item `index` with `eo.outcome` = `outcome` (none when tracing is
        off)."""
        span = spans.pop(index, None)
        if span is not None:
            span.set("eo.outcome", outcome)
            span.end()

    def _abandoned(self, a: Attempt, reason: str) -> None:
        self.steps.events.emit(ATTEMPT_ABANDONED, **a.fields, reason=f"{reason}: processed alone")

    async def _round_of(self, todo: list[_Item], settled: Settled, singly: set[str],
                        started: dict[int, Attempt], spans: dict[int, Span]) -> None:
        steps, tracer = self.steps, self.steps.tracer
        if not todo:
            return
        loaded = await steps.store.load_many([it.partition for it in todo],
                                             [it.delivery.message_id for it in todo])
        await steps.hit("after_token_load")  # the tokens were read with the TRs
        await steps.hit("after_tr_load")
        ready: list[tuple[_Item, Envelope, Loaded]] = []
        for item, load in zip(todo, loaded, strict=True):
            stored, delivery = load.token, item.delivery
            if stored is None:  # no token, in the TR's snapshot: a duplicate (protocol 3.1)
                steps.events.emit(MESSAGE_DUPLICATE, endpoint=steps.endpoint,
                                  message_id=str(delivery.message_id))
                settled[item.index] = Outcome.DUPLICATE
            elif load.tr.message_id is not None:  # an unfinished transaction: 3.1 finishes it
                singly.add(item.partition)
            elif not is_the_delivery(stored, delivery):
                singly.add(item.partition)  # not the token's message: the token decides
            elif is_follow_up(stored):  # whatever the delivery says: the token's message
                singly.add(item.partition)
            else:
                ready.append((item, stored, load))
        await steps.hit("after_token_check")
        requests: list[tuple[_Item, Attempt, CommitRequest]] = []
        for item, stored, load in ready:
            a = steps.begin(stored, item.message, item.partition, load)
            if tracer is NULL_TRACER:  # tracing off: `spans` stays empty
                request, reason = await self._decide(a)
            else:  # the message's own span, in its trace: its outputs carry it
                span = spans[item.index] = tracer.start(
                    f"process {steps.endpoint}", SpanKind.CONSUMER,
                    {**message_attributes(steps.endpoint, a.fields["message_id"]),
                     "eo.attempt_id": a.fields["attempt_id"], "eo.partition": a.partition},
                    parent=stored.headers)
                with span.current():
                    request, reason = await self._decide(a)
            if request is None:
                self._abandoned(a, reason)
                self._ended(spans, item.index, "processed alone")
                singly.add(item.partition)
            else:
                started[item.index] = a
                requests.append((item, a, request))
        await steps.hit("after_handler")
        if not requests:
            return
        await steps.hit("before_commit")
        with tracer.span("commit", attributes={"eo.transactions": len(requests)}):
            committed = await steps.store.commit_many([r for _, _, r in requests])
        done = []
        for (item, a, request), result in zip(requests, committed, strict=True):
            started.pop(item.index)  # committed or refused: ended either way
            if result is None:  # another attempt moved the partition: retried alone
                steps.events.emit(TRANSACTION_CONFLICT, endpoint=steps.endpoint,
                                  message_id=a.fields["message_id"], partition=item.partition,
                                  reason=f"partition {item.partition}: batch commit at "
                                         f"v{request.expected_version} refused")
                self._ended(spans, item.index, "conflict")
                singly.add(item.partition)
                continue
            if spans:  # the message's event, in the message's trace
                with spans[item.index].current():
                    steps.events.emit(TRANSACTION_COMMITTED, **a.fields)
            else:
                steps.events.emit(TRANSACTION_COMMITTED, **a.fields)
            done.append((item, a, result))
        await steps.hit("after_commit")
        if not done:
            return
        await steps.finisher.finish_many([(a.partition, a.stored.message_id, a.attempt_id,
                                           result) for _, a, result in done],
                                          [a.fields for _, a, _ in done])
        for item, _, _ in done:
            settled[item.index] = Outcome.PROCESSED
            if spans:
                self._ended(spans, item.index, str(Outcome.PROCESSED))

    async def _decide(self, a: Attempt) -> tuple[CommitRequest | None, str]:
        """Attempt `a`'s decision as a commit request, or None and why the message needs
        the single path (a handler failure, which that path re-checks; a blob or an HTTP
        call, whose artifacts it registers)."""
        try:
            decision = await self.steps.decide(a, recheck=False)
        except Exception as exc:  # noqa: BLE001 - the single path re-runs it, re-checking
            return None, f"the handler failed ({type(exc).__name__})"
        if decision.blobs or decision.http_call is not None:
            return None, "its decision has a blob or an HTTP call"
        return await self.steps.prepare(a, decision), ""
