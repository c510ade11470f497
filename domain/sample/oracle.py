"""The test oracle: each order's expected remaining lines and total, from plain TPC-H rows."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal, localcontext


@dataclass(frozen=True)
class LineRow:
    """One TPC-H lineitem row as the oracle needs it; `removed` is l_returnflag == 'R'."""

    order_key: int
    line_number: int
    extended_price: Decimal
    discount: Decimal
    tax: Decimal
    removed: bool


@dataclass(frozen=True)
class ExpectedOrder:
    """An order at quiescence: its sorted remaining line numbers and total (Decimal, cents)."""

    lines: tuple[int, ...]
    total: Decimal


def expected_orders(lines: Iterable[LineRow]) -> dict[int, ExpectedOrder]:
    """order_key -> ExpectedOrder, for every order that has at least one row.

    total = sum over rows not removed of extended_price * (1 - discount) * (1 + tax), exact
    (80 significant digits), then rounded half-even to 0.01. Written independently of the
    orders handler on purpose.
    """
    kept: dict[int, list[LineRow]] = {}
    for row in lines:
        bucket = kept.setdefault(row.order_key, [])
        if not row.removed:
            bucket.append(row)
    expected: dict[int, ExpectedOrder] = {}
    for order_key in sorted(kept):
        rows = kept[order_key]
        with localcontext() as exact:
            exact.prec = 80
            exact_total = Decimal(0)
            for row in rows:
                net = row.extended_price - row.extended_price * row.discount
                exact_total += net + net * row.tax
            total = exact_total.quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN)
        numbers = tuple(sorted(row.line_number for row in rows))
        expected[order_key] = ExpectedOrder(lines=numbers, total=total)
    return expected
