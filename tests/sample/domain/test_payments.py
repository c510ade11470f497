"""Unit tests of the payments handler: debits within the credit limit, stored replies."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from domain.context import Context
from domain.decisions import Reply
from domain.errors import Rejected
from domain.sample.messages import PaymentRequest, PaymentResult
from domain.sample.payments import PAYMENTS, Account, handle, open_account

CTX = Context(uuid.UUID(int=1), uuid.UUID(int=2), datetime(2024, 1, 1, tzinfo=UTC))
ACCOUNT = open_account(5, Decimal("100.00"), Decimal("50.00"))


def request(order_key: int, amount: str, customer: int = 5) -> PaymentRequest:
    return PaymentRequest(order_key, customer, Decimal(amount))


def test_open_account() -> None:
    account = open_account(5, Decimal("100.00"), Decimal("50.00"))
    assert account == Account(5, Decimal("100.00"), Decimal("50.00"), ())


def test_unknown_account_is_refused_and_stays_unknown() -> None:
    decision = handle(None, request(1, "1.00"), CTX)
    assert decision.state is None
    assert decision.reply == Reply(409, {"status": "refused", "reason": "unknown account"})


def test_payment_within_balance_and_credit_is_approved() -> None:
    decision = handle(ACCOUNT, request(9, "120.50"), CTX)
    assert decision.state == Account(5, Decimal("-20.50"), Decimal("50.00"), (9,))
    assert decision.reply == Reply(200, {"status": "approved", "order_key": 9, "amount": "120.50"})


def test_payment_up_to_the_credit_limit_is_approved() -> None:
    decision = handle(ACCOUNT, request(1, "150.00"), CTX)
    assert decision.reply is not None
    assert decision.reply.status == 200
    assert decision.state is not None
    assert decision.state.balance == Decimal("-50.00")


def test_payment_beyond_the_credit_limit_is_refused() -> None:
    decision = handle(ACCOUNT, request(3, "150.01"), CTX)
    assert decision.state == ACCOUNT
    assert decision.reply == Reply(
        409, {"status": "refused", "reason": "insufficient funds", "order_key": 3}
    )


def test_paid_keys_are_sorted_and_not_deduplicated() -> None:
    state: Account | None = ACCOUNT
    for key in (7, 2, 7):
        state = handle(state, request(key, "1.00"), CTX).state
    assert state is not None
    assert state.paid == (2, 7, 7)
    assert state.balance == Decimal("97.00")


def test_other_messages_and_customers_are_rejected() -> None:
    with pytest.raises(Rejected):
        handle(ACCOUNT, request(1, "1.00", customer=6), CTX)
    with pytest.raises(Rejected):
        handle(ACCOUNT, PaymentResult(1), CTX)


@pytest.mark.parametrize("amount", ["-0.01", "-100", "NaN", "Infinity", "-Infinity"])
def test_a_negative_or_non_finite_amount_is_rejected_not_credited(amount: str) -> None:
    with pytest.raises(Rejected, match="non-negative"):
        handle(ACCOUNT, request(1, amount), CTX)
    assert handle(ACCOUNT, request(1, "0"), CTX).reply == Reply(
        200, {"status": "approved", "order_key": 1, "amount": "0"})  # an order of returns


def test_endpoint_definition() -> None:
    assert PAYMENTS.name == "payments"
    assert PAYMENTS.state_type is Account
    assert PAYMENTS.partition_of(request(1, "1.00", customer=12)) == "12"
    assert PAYMENTS.type_name(request(1, "1.00")) == "PaymentRequest"
