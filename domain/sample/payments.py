"""The payments endpoint (HTTP callee): debits customer accounts within their credit limit."""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal

from domain.context import Context
from domain.decisions import Decision, Endpoint, Reply
from domain.errors import Rejected
from domain.sample.messages import PaymentRequest


@dataclass(frozen=True)
class Account:
    """State of one customer account (partition = str(customer_key)).

    `balance` and `credit_limit` in Decimal; the balance may go down to -credit_limit.
    `paid` holds the sorted order keys debited, one entry per debit (never deduplicated).
    """

    customer_key: int
    balance: Decimal
    credit_limit: Decimal
    paid: tuple[int, ...] = ()


def open_account(customer_key: int, balance: Decimal, credit_limit: Decimal) -> Account:
    """A new account with no payments: `balance` (TPC-H c_acctbal) and `credit_limit`."""
    return Account(customer_key=customer_key, balance=balance, credit_limit=credit_limit)


def handle(state: Account | None, message: object, context: Context) -> Decision[Account | None]:
    """Process a PaymentRequest; the reply is stored and returned to the caller. Deterministic.

    - unknown account (state None): state stays None, Reply(409, refused "unknown account");
    - balance + credit_limit >= amount: debit, Reply(200, approved, order_key, amount as str);
    - otherwise: unchanged, Reply(409, refused "insufficient funds", order_key).
    Raises Rejected for any other message, a negative or non-finite amount (it would credit
    the account: a malformed request, not a business refusal), or a request for another
    customer than the account's.
    """
    if not isinstance(message, PaymentRequest):
        raise Rejected(f"payments does not handle {type(message).__name__}")
    if not message.amount.is_finite() or message.amount < 0:
        raise Rejected(f"amount must be a non-negative number, not {message.amount}")
    if state is None:
        return Decision(
            state=None, reply=Reply(409, {"status": "refused", "reason": "unknown account"})
        )
    if state.customer_key != message.customer_key:
        raise Rejected(f"account {state.customer_key}: request for {message.customer_key}")
    key, amount = message.order_key, message.amount
    if state.balance + state.credit_limit >= amount:
        paid = tuple(sorted((*state.paid, key)))
        debited = replace(state, balance=state.balance - amount, paid=paid)
        body = {"status": "approved", "order_key": key, "amount": str(amount)}
        return Decision(state=debited, reply=Reply(200, body))
    refusal = {"status": "refused", "reason": "insufficient funds", "order_key": key}
    return Decision(state=state, reply=Reply(409, refusal))


def payment_partition(message: PaymentRequest) -> str:
    """The partition key of a payment request: str(customer_key)."""
    return str(message.customer_key)


PAYMENTS: Endpoint[Account | None] = Endpoint(
    name="payments",
    messages={"PaymentRequest": PaymentRequest},
    partition_of=payment_partition,
    handle=handle,
    state_type=Account,
    outputs=(),
)
