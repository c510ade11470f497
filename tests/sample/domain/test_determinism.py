"""Property tests: handlers are deterministic and an order's outcome ignores message order."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.context import Context, HttpResponse
from domain.decisions import Decision
from domain.errors import Rejected
from domain.sample import ledger, orders, payments
from domain.sample.messages import (
    AddItem,
    OrderConfirmed,
    OrderRejected,
    PaymentRequest,
    PaymentResult,
    PlaceOrder,
    RemoveItem,
    SubmitOrder,
)
from domain.sample.oracle import ExpectedOrder, LineRow, expected_orders

SETTINGS = settings(max_examples=200, deadline=None)
NOW = datetime(2024, 1, 1, tzinfo=UTC)
cents = st.integers(0, 10_000_000).map(lambda c: Decimal(c).scaleb(-2))
fraction = st.integers(0, 10).map(lambda p: Decimal(p).scaleb(-2))
responses = st.sampled_from(
    [
        None,
        HttpResponse(200, {"status": "approved"}),
        HttpResponse(409, {"status": "refused", "reason": "insufficient funds"}),
        HttpResponse(409, {}),
        HttpResponse(500, {}),
    ]
)
contexts = st.builds(Context, st.uuids(), st.uuids(), st.just(NOW), responses)


@st.composite
def order_commands(draw: st.DrawFn) -> tuple[int, list[object], list[LineRow]]:
    """One order: its key, full command set (as the TPC-H producer sends it), oracle rows."""
    key = draw(st.integers(1, 10**6))
    count = draw(st.integers(0, 7))
    place = PlaceOrder(key, draw(st.integers(1, 150)), date(1995, 3, 1), "2-HIGH", count)
    messages: list[object] = [place]
    rows: list[LineRow] = []
    for number in range(1, count + 1):
        price, discount, tax = draw(cents), draw(fraction), draw(fraction)
        removed = draw(st.booleans())
        messages.append(AddItem(key, number, number * 10, Decimal(1), price, discount, tax))
        if removed:
            messages.append(RemoveItem(key, number))
        rows.append(LineRow(key, number, price, discount, tax, removed))
    messages.append(SubmitOrder(key, sum(row.removed for row in rows)))
    return key, messages, rows


def twice(
    handle: Callable[[Any, Any, Any], Decision[Any]], state: Any, m: Any, ctx: Context
) -> Any:
    """Handle `m` twice (on the state and on a deep copy); both must give equal results."""
    outcomes: list[object] = []
    for given_state in (state, copy.deepcopy(state)):
        try:
            outcomes.append(handle(given_state, m, ctx))
        except Rejected as error:
            outcomes.append(("rejected", error.reason))
    assert outcomes[0] == outcomes[1]
    return outcomes[0].state if isinstance(outcomes[0], Decision) else state


@SETTINGS
@given(st.data(), order_commands())
def test_orders_handler_is_deterministic(
    data: st.DataObject, commands: tuple[int, list[object], list[LineRow]]
) -> None:
    key, messages, _ = commands
    noise = [PaymentResult(key), PlaceOrder(key, 999, date(2000, 1, 1), "1-URGENT", 2)]
    pool = st.sampled_from([*messages, *noise, AddItem(key, 9, 1, *[Decimal(1)] * 4)])
    state: orders.Order | None = None
    for m in data.draw(st.lists(pool, max_size=25)):
        state = twice(orders.handle, state, m, data.draw(contexts))


@SETTINGS
@given(st.data(), order_commands())
def test_any_order_of_commands_gives_the_oracle_outcome(
    data: st.DataObject, commands: tuple[int, list[object], list[LineRow]]
) -> None:
    key, messages, rows = commands
    repeats = data.draw(st.lists(st.sampled_from(messages), max_size=4))
    shuffled = data.draw(st.permutations([*messages, *repeats]))
    ctx = Context(uuid.UUID(int=1), uuid.UUID(int=2), NOW)
    state: orders.Order | None = None
    finalisations = 0
    for m in shuffled:
        decision = orders.handle(state, m, ctx)
        finalisations += decision.http_call is not None
        assert len(decision.blobs) == int(decision.http_call is not None)
        state = decision.state
    assert state is not None
    expected = expected_orders(rows).get(key, ExpectedOrder((), Decimal("0.00")))
    assert finalisations == 1
    assert state.status == "awaiting_payment"
    assert tuple(line.line_number for line in state.lines) == expected.lines
    assert state.total == expected.total
    assert state.removed == tuple(row.line_number for row in rows if row.removed)


ledger_events = st.one_of(
    st.builds(OrderConfirmed, st.integers(1, 50), st.just(5), cents, st.just("invoices/x")),
    st.builds(OrderRejected, st.integers(1, 50), st.just(5), cents, st.sampled_from(["a", "b"])),
    st.builds(PaymentResult, st.integers(1, 50)),
)


@SETTINGS
@given(st.data(), st.lists(ledger_events, max_size=20))
def test_ledger_is_deterministic_and_order_independent(
    data: st.DataObject, events: list[object]
) -> None:
    finals = []
    for sequence in (events, data.draw(st.permutations(events))):
        state: ledger.CustomerLedger | None = None
        for m in sequence:
            state = twice(ledger.handle, state, m, data.draw(contexts))
        finals.append(state)
    assert finals[0] == finals[1]


payment_requests = st.one_of(
    st.builds(PaymentRequest, st.integers(1, 50), st.just(5), cents),
    st.builds(PaymentRequest, st.integers(1, 50), st.just(6), cents),
    st.builds(OrderConfirmed, st.integers(1, 50), st.just(5), cents, st.just("invoices/x")),
)


@SETTINGS
@given(
    st.data(),
    st.one_of(st.none(), st.builds(payments.open_account, st.just(5), cents, cents)),
    st.lists(payment_requests, max_size=20),
)
def test_payments_handler_is_deterministic(
    data: st.DataObject, account: payments.Account | None, requests: list[object]
) -> None:
    state = account
    for m in requests:
        state = twice(payments.handle, state, m, data.draw(contexts))
    if account is None:
        assert state is None
        return
    balance, paid = account.balance, []
    for m in requests:
        if (
            isinstance(m, PaymentRequest)
            and m.customer_key == 5
            and balance + account.credit_limit >= m.amount
        ):
            balance -= m.amount
            paid.append(m.order_key)
    assert state == payments.Account(5, balance, account.credit_limit, tuple(sorted(paid)))
