"""The counters' pure endpoints (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from domain.context import Context
from domain.decisions import CallHttp, CreateBlob, Decision, Endpoint, Outgoing, Reply
from domain.errors import Rejected
from domain.gateway import gateway_for


@dataclass(frozen=True)
class Add:
    """Add `amount` (a power of two in tests) to `counter`."""

    counter: str
    amount: int


@dataclass(frozen=True)
class Spend:
    """Ask the bank to debit `amount` from `counter`'s account; the answer arrives in `Spent`."""

    counter: str
    amount: int


@dataclass(frozen=True)
class Spent:
    """The follow-up of a `Spend`'s HTTP call (its response in `Context.http_response`)."""

    counter: str
    amount: int


@dataclass(frozen=True)
class Reported:
    """What `counter` reports to `audit` after a `Spent`: the amount and the bank's status."""

    counter: str
    amount: int
    status: int
    total: int


@dataclass(frozen=True)
class Withdraw:
    """The bank's stored request: debit `amount` from `account`."""

    account: str
    amount: int


@dataclass(frozen=True)
class Tally:
    """A counter: the total added, the IDs of the messages applied (in order), its receipts'
    blob keys, and what the bank answered to its `Spend`s (`spent`: amounts debited,
    `refused`: amounts refused)."""

    total: int = 0
    applied: tuple[str, ...] = ()
    receipts: tuple[str, ...] = ()
    spent: tuple[int, ...] = ()
    refused: tuple[int, ...] = ()


@dataclass(frozen=True)
class AuditLog:
    """What `audit` received for one counter: the reports, in arrival order."""

    reports: tuple[Reported, ...] = ()


@dataclass(frozen=True)
class Account:
    """A bank account: its balance and the amounts debited."""

    balance: int = 0
    debits: tuple[int, ...] = ()


def counter_handle(state: Tally | None, message: object, context: Context) -> Decision[Tally]:
    """`Add`: total += amount, receipt blob; `Spend`: receipt blob and HTTP call to `bank`;
    `Spent`: record the answer (200 debited, 409 refused) and report to `audit`. Rejects a
    negative amount."""
    tally = state or Tally()
    applied = (*tally.applied, str(context.message_id))
    if isinstance(message, Add | Spend) and message.amount < 0:
        raise Rejected(f"negative amount {message.amount}")
    if isinstance(message, Add | Spend):
        key = context.artifact_key("receipts")
        signed = message.amount if isinstance(message, Add) else -message.amount
        receipt = CreateBlob(key, f"{context.message_id}:{signed}".encode(), "text/plain")
        receipts = (*tally.receipts, key)
        if isinstance(message, Add):
            new = replace(tally, total=tally.total + message.amount, applied=applied,
                          receipts=receipts)
            return Decision(state=new, blobs=(receipt,))
        call = CallHttp("bank", {"account": message.counter, "amount": message.amount},
                        follow_up=Spent(message.counter, message.amount))
        return Decision(state=replace(tally, applied=applied, receipts=receipts),
                        blobs=(receipt,), http_call=call)
    if isinstance(message, Spent):
        response = context.http_response
        if response is None:
            raise Rejected("Spent without the bank's response")
        if response.status == 200:
            new = replace(tally, applied=applied, spent=(*tally.spent, message.amount))
        elif response.status == 409:
            new = replace(tally, applied=applied, refused=(*tally.refused, message.amount))
        else:
            raise Rejected(f"unexpected bank status {response.status}")
        report = Reported(message.counter, message.amount, response.status, new.total)
        return Decision(state=new, outgoing=(Outgoing("audit", report),))
    raise Rejected(f"counter does not handle {type(message).__name__}")


def audit_handle(state: AuditLog | None, message: object, context: Context
                 ) -> Decision[AuditLog]:
    """Append the report."""
    if not isinstance(message, Reported):
        raise Rejected(f"audit does not handle {type(message).__name__}")
    log = state or AuditLog()
    return Decision(state=AuditLog((*log.reports, message)))


def bank_handle(state: Account | None, message: object, context: Context
                ) -> Decision[Account | None]:
    """Debit within the balance (reply 200), else refuse (409); an unknown account refuses.
    Rejects a negative amount (a permanent error: no reply is stored)."""
    if not isinstance(message, Withdraw):
        raise Rejected(f"bank does not handle {type(message).__name__}")
    if message.amount < 0:
        raise Rejected(f"negative amount {message.amount}")
    if state is None:
        return Decision(state=None, reply=Reply(409, {"refused": "unknown account"}))
    if state.balance >= message.amount:
        debited = Account(state.balance - message.amount, (*state.debits, message.amount))
        return Decision(state=debited, reply=Reply(200, {"debited": message.amount}))
    return Decision(state=state, reply=Reply(409, {"refused": "insufficient funds"}))


COUNTER: Endpoint[Tally] = Endpoint(
    name="counter",
    messages={"Add": Add, "Spend": Spend, "Spent": Spent},
    partition_of=lambda m: str(m.counter),
    handle=counter_handle,
    state_type=Tally,
    outputs=("audit",),
)
AUDIT: Endpoint[AuditLog] = Endpoint(
    name="audit",
    messages={"Reported": Reported},
    partition_of=lambda m: str(m.counter),
    handle=audit_handle,
    state_type=AuditLog,
)
BANK: Endpoint[Account | None] = Endpoint(
    name="bank",
    messages={"Withdraw": Withdraw},
    partition_of=lambda m: str(m.account),
    handle=bank_handle,
    state_type=Account,
)
FRONT = gateway_for(COUNTER, {"Add": Add, "Spend": Spend}, name="front")
