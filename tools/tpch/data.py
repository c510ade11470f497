"""Generate the sample domain's input commands and oracle from TPC-H (DuckDB, offline)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import duckdb
import duckdb_extension_tpch

from domain.sample.messages import AddItem, PlaceOrder, RemoveItem, SubmitOrder, natural_id
from domain.sample.oracle import ExpectedOrder, LineRow, expected_orders

_OFFLINE: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}
_ORDERS_SQL = """
    SELECT o_orderkey, o_custkey, o_orderdate, o_orderpriority,
           (SELECT count(*) FROM lineitem WHERE l_orderkey = o_orderkey)
    FROM orders ORDER BY o_orderkey
"""
_LINES_SQL = """
    SELECT l_orderkey, l_linenumber, l_partkey, l_quantity, l_extendedprice, l_discount, l_tax,
           l_returnflag = 'R'
    FROM lineitem ORDER BY l_orderkey, l_linenumber
"""


@dataclass(frozen=True)
class Command:
    """A boundary command: its natural message ID and its message (a frozen dataclass)."""

    message_id: uuid.UUID
    message: object


@dataclass(frozen=True)
class TpchSample:
    """Everything the demo needs from one TPC-H scale factor.

    - `commands`: per order, in order key order: PlaceOrder, its AddItems, RemoveItems for
      lines with l_returnflag = 'R', SubmitOrder (line numbers ascending).
    - `customers`: (c_custkey, c_acctbal in Decimal), sorted by customer key.
    - `expected`: the oracle, order_key -> ExpectedOrder.
    - `order_customers`: order_key -> customer_key.
    """

    commands: tuple[Command, ...]
    customers: tuple[tuple[int, Decimal], ...]
    expected: dict[int, ExpectedOrder]
    order_customers: dict[int, int]

    def subset(self, order_keys: Iterable[int]) -> TpchSample:
        """The sample restricted to `order_keys` (commands, oracle, order customers; every
        customer is kept, so accounts open as in the full sample). Raises KeyError for an
        order key the sample does not hold."""
        keys = set(order_keys)
        unknown = keys - self.expected.keys()
        if unknown:
            raise KeyError(f"orders not in the sample: {sorted(unknown)[:5]}")
        return TpchSample(
            commands=tuple(c for c in self.commands
                           if getattr(c.message, "order_key", None) in keys),
            customers=self.customers,
            expected={k: v for k, v in self.expected.items() if k in keys},
            order_customers={k: v for k, v in self.order_customers.items() if k in keys},
        )


def extension_path() -> Path:
    """The tpch.duckdb_extension file shipped in the duckdb_extension_tpch package.

    Raises FileNotFoundError when the package holds no such file.
    """
    root = Path(duckdb_extension_tpch.__file__).parent
    found = sorted(root.glob("extensions/*/tpch.duckdb_extension"))
    if not found:
        raise FileNotFoundError(f"no tpch.duckdb_extension under {root}")
    return found[-1]


def generate(sf: float) -> TpchSample:
    """Generate TPC-H at scale factor `sf` in an in-memory DuckDB (no network) and derive
    the commands, customers and oracle. Deterministic: same `sf` -> equal samples.
    """
    with duckdb.connect(":memory:", config=_OFFLINE) as con:
        quoted = extension_path().as_posix().replace("'", "''")
        con.execute(f"LOAD '{quoted}'")
        con.execute("CALL dbgen(sf = ?)", [sf])
        orders = con.execute(_ORDERS_SQL).fetchall()
        lines = con.execute(_LINES_SQL).fetchall()
        customers = con.execute("SELECT c_custkey, c_acctbal FROM customer ORDER BY 1").fetchall()
    items: dict[int, list[AddItem]] = {}
    removals: dict[int, list[int]] = {}
    rows: list[LineRow] = []
    for o, n, part, quantity, price, discount, tax, returned in lines:
        items.setdefault(o, []).append(AddItem(o, n, part, quantity, price, discount, tax))
        if returned:
            removals.setdefault(o, []).append(n)
        rows.append(LineRow(o, n, price, discount, tax, bool(returned)))
    commands: list[Command] = []
    for o, customer, order_date, priority, line_count in orders:
        removed = removals.get(o, [])
        commands.append(
            Command(
                natural_id("PlaceOrder", o),
                PlaceOrder(o, customer, order_date, priority, line_count),
            )
        )
        commands += [Command(natural_id("AddItem", o, m.line_number), m) for m in items.get(o, [])]
        commands += [Command(natural_id("RemoveItem", o, n), RemoveItem(o, n)) for n in removed]
        commands.append(Command(natural_id("SubmitOrder", o), SubmitOrder(o, len(removed))))
    return TpchSample(
        commands=tuple(commands),
        customers=tuple((key, balance) for key, balance in customers),
        expected=expected_orders(rows),
        order_customers={o: customer for o, customer, *_ in orders},
    )


#: The TPC-H tables the pipeline reads (ingest: orders and lineitem; payments: customer).
EXPORTED_TABLES = ("orders", "lineitem", "customer")


def export_tables(sf: float, directory: Path, fmt: str = "parquet") -> dict[str, Path]:
    """Generate TPC-H at scale factor `sf` (offline DuckDB) and write the `orders`, `lineitem`
    and `customer` tables to `directory` as `<table>.parquet` or `<table>.csv` (with a header
    row), the input dataset of `eo pipeline ingest-tpch` and `eo pipeline audit`.

    Returns table name -> file written. Raises ValueError for a format other than parquet/csv.
    Deterministic: same `sf` gives the same rows as `generate(sf)`.
    """
    if fmt not in ("parquet", "csv"):
        raise ValueError(f"format must be parquet or csv, not {fmt!r}")
    directory.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    with duckdb.connect(":memory:", config=_OFFLINE) as con:
        quoted = extension_path().as_posix().replace("'", "''")
        con.execute(f"LOAD '{quoted}'")
        con.execute("CALL dbgen(sf = ?)", [sf])
        for table in EXPORTED_TABLES:
            target = directory / f"{table}.{fmt}"
            options = "FORMAT parquet" if fmt == "parquet" else "FORMAT csv, HEADER true"
            path = target.as_posix().replace("'", "''")
            con.execute(f"COPY (SELECT * FROM {table}) TO '{path}' ({options})")
            written[table] = target
    return written
