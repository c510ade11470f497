"""Tests of the TPC-H sample generator at sf=0.001 (1,500 orders, 6,005 line items)."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from domain.context import Context
from domain.sample.messages import AddItem, PlaceOrder, RemoveItem, SubmitOrder, natural_id
from domain.sample.orders import ORDERS, Order
from tools.tpch.data import TpchSample, generate


@pytest.fixture(scope="module")
def sample() -> TpchSample:
    return generate(0.001)


def test_counts(sample: TpchSample) -> None:
    kinds = Counter(type(command.message).__name__ for command in sample.commands)
    assert kinds == {"PlaceOrder": 1500, "AddItem": 6005, "RemoveItem": 1457, "SubmitOrder": 1500}
    assert len(sample.expected) == 1500
    assert len(sample.order_customers) == 1500
    assert len(sample.customers) == 150
    assert all(isinstance(balance, Decimal) for _, balance in sample.customers)
    assert set(sample.order_customers.values()) <= {key for key, _ in sample.customers}


def test_message_ids_are_unique_natural_ids(sample: TpchSample) -> None:
    ids = [command.message_id for command in sample.commands]
    assert len(set(ids)) == len(ids)
    for command in sample.commands[:50]:
        m = command.message
        if isinstance(m, PlaceOrder):
            assert command.message_id == natural_id("PlaceOrder", m.order_key)
        elif isinstance(m, AddItem):
            assert command.message_id == natural_id("AddItem", m.order_key, m.line_number)
        elif isinstance(m, RemoveItem):
            assert command.message_id == natural_id("RemoveItem", m.order_key, m.line_number)
        else:
            assert isinstance(m, SubmitOrder)
            assert command.message_id == natural_id("SubmitOrder", m.order_key)


def test_commands_of_each_order_are_in_producer_order(sample: TpchSample) -> None:
    first = [type(command.message).__name__ for command in sample.commands[:9]]
    assert first[0] == "PlaceOrder"
    assert first.index("SubmitOrder") == 1 + 6 + first.count("RemoveItem")


def test_generation_is_deterministic(sample: TpchSample) -> None:
    again = generate(0.001)
    assert again.commands == sample.commands
    assert again.customers == sample.customers
    assert again.expected == sample.expected


def test_orders_handler_reaches_the_oracle_on_tpch(sample: TpchSample) -> None:
    ctx = Context(uuid.UUID(int=1), uuid.UUID(int=2), datetime(2024, 1, 1, tzinfo=UTC))
    states: dict[str, Order] = {}
    for command in sample.commands:
        partition = ORDERS.partition_of(command.message)
        states[partition] = ORDERS.handle(states.get(partition), command.message, ctx).state
    for key, expected in sample.expected.items():
        order = states[str(key)]
        assert order.status == "awaiting_payment"
        assert order.customer_key == sample.order_customers[key]
        assert tuple(line.line_number for line in order.lines) == expected.lines
        assert order.total == expected.total


def test_a_subset_keeps_the_chosen_orders_commands_and_oracle_and_every_customer(
        sample: TpchSample) -> None:
    keys = [1, 3, 7]
    part = sample.subset(keys)
    assert set(part.expected) == set(keys) == set(part.order_customers)
    assert {c.message.order_key for c in part.commands} == set(keys)  # type: ignore[attr-defined]
    assert len(part.commands) == sum(
        1 for c in sample.commands if c.message.order_key in keys)  # type: ignore[attr-defined]
    assert part.customers == sample.customers
    with pytest.raises(KeyError, match="999999"):
        sample.subset([1, 999999])
