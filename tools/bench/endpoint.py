"""A tiny pure endpoint for `eo bench`: a deposit updates its account and emits one output."""

from __future__ import annotations

from dataclasses import dataclass

from domain.context import Context
from domain.decisions import Decision, Endpoint, Outgoing
from domain.errors import Rejected

#: Destination of the outputs (the bench gives each run a sink of its own).
SINK = "bench-sink"


@dataclass(frozen=True)
class Deposit:
    """Put `cents` into `account`; `sent_at_ns` is the producer's monotonic clock (ns) at
    publication, carried through to the output so the sink can measure end-to-end latency."""

    account: str
    cents: int
    sent_at_ns: int


@dataclass(frozen=True)
class Deposited:
    """The output of one `Deposit`: the same fields (`sent_at_ns` in nanoseconds)."""

    account: str
    cents: int
    sent_at_ns: int


@dataclass(frozen=True)
class Balance:
    """State of one account (partition = account): total `cents` and deposits counted."""

    cents: int = 0
    count: int = 0


def handle(state: Balance | None, message: object, context: Context,
           sink: str = SINK) -> Decision[Balance]:
    """Add the deposit to the balance and emit one `Deposited` to `sink`. Deterministic;
    raises Rejected for anything but a `Deposit`."""
    if not isinstance(message, Deposit):
        raise Rejected(f"bench does not handle {type(message).__name__}")
    balance = state or Balance()
    new = Balance(balance.cents + message.cents, balance.count + 1)
    out = Deposited(message.account, message.cents, message.sent_at_ns)
    return Decision(state=new, outgoing=(Outgoing(sink, out),))


def endpoint(name: str, sink: str = SINK) -> Endpoint[Balance]:
    """The bench endpoint called `name`, sending its outputs to the queue of `sink`."""

    def handle_to_sink(state: Balance | None, message: object, context: Context
                       ) -> Decision[Balance]:
        return handle(state, message, context, sink)

    return Endpoint(
        name=name,
        messages={"Deposit": Deposit},
        partition_of=lambda m: str(m.account),
        handle=handle_to_sink,
        state_type=Balance,
        outputs=(sink,),
    )
