"""Printable documents a handler may request (an invoice): plain data, rendered outside."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date


@dataclass(frozen=True)
class Document:
    """A one-table document: a title, label/value fields above and below a table.

    The domain says what is printed; a `DocumentRenderer` (application port, PDF adapter)
    decides how, deterministically, so the same decision yields the same bytes.

    - `fields`: (label, value) pairs printed under the title;
    - `columns`, `rows`: the table, every row as long as `columns`;
    - `totals`: (label, value) pairs printed under the table;
    - `dated`: the document's date (its metadata date; never the wall clock).
    Raises ValueError when a row's length differs from the columns'.
    """

    title: str
    fields: tuple[tuple[str, str], ...]
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    totals: tuple[tuple[str, str], ...]
    dated: date | None = None

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"row {row} has {len(row)} cells for {len(self.columns)} columns")
