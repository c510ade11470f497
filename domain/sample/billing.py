"""An order's money: line items, their exact amounts, the rounded total and the invoice text."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from decimal import ROUND_HALF_EVEN, Decimal, Inexact, InvalidOperation, Overflow, localcontext
from decimal import Context as DecimalContext

CENT = Decimal("0.01")
_EXACT = DecimalContext(prec=60, traps=[Inexact, InvalidOperation, Overflow])
_ROUNDING = DecimalContext(prec=60, rounding=ROUND_HALF_EVEN)


@dataclass(frozen=True)
class Line:
    """A line item of an order; money in Decimal, `discount` and `tax` as fractions (0.04 = 4%)."""

    line_number: int
    part_key: int
    quantity: Decimal
    extended_price: Decimal
    discount: Decimal
    tax: Decimal


def line_amount(line: Line) -> Decimal:
    """extended_price * (1 - discount) * (1 + tax), exact, not rounded.

    Raises decimal.Inexact if the product needs more than 60 significant digits.
    """
    with localcontext(_EXACT):
        return line.extended_price * (1 - line.discount) * (1 + line.tax)


def order_total(lines: Iterable[Line]) -> Decimal:
    """The exact sum of the lines' amounts, rounded half-even to cents ("0.00" for no lines)."""
    with localcontext(_EXACT):
        exact = sum((line_amount(line) for line in lines), Decimal(0))
    return exact.quantize(CENT, context=_ROUNDING)


def invoice_document(
    order_key: int,
    customer_key: int | None,
    order_date: date | None,
    priority: str | None,
    lines: Iterable[Line],
    removed: Iterable[int],
    total: Decimal,
) -> bytes:
    """The invoice as deterministic plain text, UTF-8: header, one row per line, the total."""
    rows = [
        "INVOICE",
        f"order: {order_key}",
        f"customer: {customer_key}",
        f"order date: {order_date.isoformat() if order_date is not None else '-'}",
        f"priority: {priority}",
        "",
        "line\tpart\tquantity\textended_price\tdiscount\ttax\tamount",
    ]
    rows += [
        f"{x.line_number}\t{x.part_key}\t{x.quantity}\t{x.extended_price}\t"
        f"{x.discount}\t{x.tax}\t{line_amount(x)}"
        for x in lines
    ]
    removed_text = ", ".join(str(n) for n in removed) or "none"
    rows += ["", f"removed lines: {removed_text}", f"total: {total}", ""]
    return "\n".join(rows).encode("utf-8")
