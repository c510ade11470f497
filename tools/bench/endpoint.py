"""A tiny pure endpoint for `eo bench`: a deposit updates its account and emits one output.
Its state is a small balance, or, for a load shape with a big state (tools/bench/shapes.py),
the balance with order lines of about the shape's size, one of which every deposit changes."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace

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
class Line:
    """One order line of a big state: `sku`, `quantity`, `cents` (the line's total)."""

    sku: int
    quantity: int
    cents: int


@dataclass(frozen=True)
class Balance:
    """State of one account (partition = account): total `cents`, deposits counted, and
    the order `lines` of a big-state load shape (empty otherwise)."""

    cents: int = 0
    count: int = 0
    lines: tuple[Line, ...] = ()


#: bytes one line takes in the stored state (JSON, a line of this many digits), for sizing
_LINE_BYTES = len(json.dumps({"sku": 10**6, "quantity": 100, "cents": 10**5})) + 2


def opening_lines(account: str, state_bytes: int) -> tuple[Line, ...]:
    """An account's lines, about `state_bytes` of JSON in all (none for 0), the same for
    the same account: drawn from a generator seeded by its name, varied enough that
    PostgreSQL's compression of a stored state does not shrink it to nothing."""
    if state_bytes <= 0:
        return ()
    rng = random.Random(account)
    return tuple(Line(rng.randrange(10**6, 10**7), rng.randrange(1, 100),
                      rng.randrange(10**4, 10**5))
                 for _ in range(max(1, state_bytes // _LINE_BYTES)))


def handle(state: Balance | None, message: object, context: Context,
           sink: str = SINK, state_bytes: int = 0) -> Decision[Balance]:
    """Add the deposit to the balance and emit one `Deposited` to `sink`; with
    `state_bytes`, the account's state carries about that many bytes of order lines (made
    at its first deposit) and the deposit adds one to the quantity of the line its count
    points at. Deterministic; raises Rejected for anything but a `Deposit`."""
    if not isinstance(message, Deposit):
        raise Rejected(f"bench does not handle {type(message).__name__}")
    balance = state or Balance(lines=opening_lines(message.account, state_bytes))
    lines = balance.lines
    if lines:
        at = balance.count % len(lines)
        lines = (*lines[:at], replace(lines[at], quantity=lines[at].quantity + 1),
                 *lines[at + 1:])
    new = Balance(balance.cents + message.cents, balance.count + 1, lines)
    out = Deposited(message.account, message.cents, message.sent_at_ns)
    return Decision(state=new, outgoing=(Outgoing(sink, out),))


def endpoint(name: str, sink: str = SINK, state_bytes: int = 0) -> Endpoint[Balance]:
    """The bench endpoint called `name`, sending its outputs to the queue of `sink`, its
    states about `state_bytes` big (0: the small balance)."""

    def handle_to_sink(state: Balance | None, message: object, context: Context
                       ) -> Decision[Balance]:
        return handle(state, message, context, sink, state_bytes)

    return Endpoint(
        name=name,
        messages={"Deposit": Deposit},
        partition_of=lambda m: str(m.account),
        handle=handle_to_sink,
        state_type=Balance,
        outputs=(sink,),
    )
