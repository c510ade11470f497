"""An order's money: line items, their exact amounts, the rounded total and the invoice text."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from decimal import ROUND_HALF_EVEN, Decimal, Inexact, InvalidOperation, Overflow, localcontext
from decimal import Context as DecimalContext

from domain.documents import Document

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
) -> Document:
    """The invoice: order fields, one table row per remaining line with its exact amount,
    the removed lines and the total (rendered to PDF outside the domain)."""
    rows = tuple(
        (str(x.line_number), str(x.part_key), str(x.quantity), str(x.extended_price),
         str(x.discount), str(x.tax), str(line_amount(x)))
        for x in lines
    )
    removed_text = ", ".join(str(n) for n in removed) or "none"
    return Document(
        title=f"Invoice for order {order_key}",
        fields=(
            ("Order", str(order_key)),
            ("Customer", str(customer_key)),
            ("Order date", order_date.isoformat() if order_date is not None else "-"),
            ("Priority", str(priority)),
        ),
        columns=("Line", "Part", "Quantity", "Price", "Discount", "Tax", "Amount"),
        rows=rows,
        totals=(("Removed lines", removed_text), ("Total", str(total))),
        dated=order_date,
    )
