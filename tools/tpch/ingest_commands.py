"""The per-partition bodies of the ingest's derivation (`mapPartitions`): TPC-H rows to
boundary commands with natural message IDs and codec-encoded bodies. Imports only the domain
and the codec, so Spark's Python workers start fast."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from application.codec import encode
from domain.sample.messages import AddItem, PlaceOrder, RemoveItem, SubmitOrder, natural_id

#: One derived command: (natural message ID as text, type name, JSON body).
CommandRow = tuple[str, str, bytearray]


def order_commands(rows: Iterable[Any]) -> Iterator[CommandRow]:
    """`mapPartitions` body: per order row (o_orderkey, o_custkey, o_orderdate,
    o_orderpriority, line_count, removal_count) its PlaceOrder and SubmitOrder."""
    for row in rows:
        o = row.o_orderkey
        place = PlaceOrder(o, row.o_custkey, row.o_orderdate, row.o_orderpriority,
                           row.line_count)
        yield str(natural_id("PlaceOrder", o)), "PlaceOrder", bytearray(encode(place))
        submit = SubmitOrder(o, row.removal_count)
        yield str(natural_id("SubmitOrder", o)), "SubmitOrder", bytearray(encode(submit))


def line_commands(rows: Iterable[Any]) -> Iterator[CommandRow]:
    """`mapPartitions` body: per lineitem row its AddItem, and a RemoveItem when
    `l_returnflag` is 'R'."""
    for row in rows:
        o, n = row.l_orderkey, row.l_linenumber
        item = AddItem(o, n, row.l_partkey, row.l_quantity, row.l_extendedprice,
                       row.l_discount, row.l_tax)
        yield str(natural_id("AddItem", o, n)), "AddItem", bytearray(encode(item))
        if row.l_returnflag == "R":
            removal = RemoveItem(o, n)
            yield str(natural_id("RemoveItem", o, n)), "RemoveItem", bytearray(encode(removal))
