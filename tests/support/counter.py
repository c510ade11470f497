"""A minimal endpoint for protocol tests: every message is recorded in its partition's state,
produces one blob and one outgoing message that repeats the state it committed.
`PLAIN_COUNTER` is the same without the blob (blob key ""): what the batched token path
processes in its batches (a blob is a registered artifact: that message goes singly)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from domain.context import Context
from domain.decisions import CreateBlob, Decision, Endpoint, Outgoing


@dataclass(frozen=True)
class Add:
    """Add `amount` to `partition`'s total."""

    partition: str
    amount: int


@dataclass(frozen=True)
class Added:
    """The output of one `Add`: the incoming ID, the state after it, the blob it made."""

    partition: str
    incoming: str
    applied: tuple[str, ...]
    blob_key: str


@dataclass(frozen=True)
class Tally:
    """A partition's state: the IDs applied (in order), their sum, their blobs' keys."""

    applied: tuple[str, ...] = ()
    total: int = 0
    blobs: tuple[str, ...] = ()


def handle(state: Tally | None, message: Add, context: Context) -> Decision[Tally]:
    """Apply `message`: record it, write its blob, send the state it committed to `audit`."""
    state = state or Tally()
    key = context.artifact_key("receipts")
    applied = (*state.applied, str(context.message_id))
    new = Tally(applied, state.total + message.amount, (*state.blobs, key))
    out = Added(message.partition, str(context.message_id), applied, key)
    return Decision(
        state=new,
        outgoing=(Outgoing("audit", out),),
        blobs=(CreateBlob(key, f"{context.message_id}:{message.amount}".encode(), "text/plain"),),
    )


COUNTER: Endpoint[Tally] = Endpoint(
    name="counter",
    messages={"Add": Add},
    partition_of=lambda m: m.partition,
    handle=handle,
    state_type=Tally,
    outputs=("audit",),
)


def handle_plain(state: Tally | None, message: Add, context: Context) -> Decision[Tally]:
    """`handle` without the blob: the output and the state name blob key ""."""
    state = state or Tally()
    applied = (*state.applied, str(context.message_id))
    new = Tally(applied, state.total + message.amount, (*state.blobs, ""))
    out = Added(message.partition, str(context.message_id), applied, "")
    return Decision(state=new, outgoing=(Outgoing("audit", out),))


#: `COUNTER` with the plain handler
PLAIN_COUNTER: Endpoint[Tally] = replace(COUNTER, handle=handle_plain)
