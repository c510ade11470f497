"""Realistic audit fixtures: the first orders of TPC-H sf=0.001 run through the sample's own
handlers (orders, payments, ledger) in-process, their states written to a private PostgreSQL
database with the real encoders, their invoices put into a moto bucket."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import boto3
import duckdb

from adapters.postgres.admin import drop_database, ensure_database, with_database
from adapters.postgres.migrate import upgrade_async
from application.codec import to_jsonable
from domain.context import Context, HttpResponse
from domain.sample import ledger as ledger_endpoint
from domain.sample import orders as orders_endpoint
from domain.sample import payments as payments_endpoint
from domain.sample.ledger import CustomerLedger
from domain.sample.messages import PaymentRequest, PaymentResult
from domain.sample.orders import Order
from domain.sample.payments import Account, open_account
from tools.tpch.data import TpchSample, export_tables

SF = 0.001
#: With this credit limit about half of the first orders are paid and half refused, so the
#: fixture has both outcomes.
CREDIT_LIMIT = Decimal(100_000)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class World:
    """The endpoints' states after the chosen orders have settled, and the invoices."""

    sample: TpchSample
    order_keys: list[int]
    orders: dict[int, Order] = field(default_factory=dict)
    accounts: dict[int, Account] = field(default_factory=dict)
    ledgers: dict[int, CustomerLedger] = field(default_factory=dict)
    invoices: dict[str, bytes] = field(default_factory=dict)


def _context(**kw: Any) -> Context:
    return Context(uuid.uuid4(), uuid.uuid4(), NOW, **kw)


def settle(sample: TpchSample, order_keys: list[int]) -> World:
    """Drive each order's commands through the orders handler, its payment through payments,
    its shipment through a carrier answering 201, and its outcome through the ledger, as the
    service would (one attempt each)."""
    world = World(sample, order_keys)
    world.accounts = {c: open_account(c, b, CREDIT_LIMIT) for c, b in sample.customers}
    chosen = set(order_keys)
    decisions: dict[int, Any] = {}
    for command in sample.commands:
        message = command.message
        key = message.order_key  # type: ignore[attr-defined]
        if key not in chosen:
            continue
        decision = orders_endpoint.handle(world.orders.get(key), message, _context())
        world.orders[key] = decision.state
        if decision.http_call is not None:
            decisions[key] = decision
    for key, decision in decisions.items():
        order = world.orders[key]
        for blob in decision.blobs:
            world.invoices[blob.key] = f"invoice of order {key}".encode()
        assert order.customer_key is not None
        assert order.total is not None
        account = world.accounts.get(order.customer_key)
        request = PaymentRequest(key, order.customer_key, order.total)
        paid = payments_endpoint.handle(account, request, _context())
        if paid.state is not None:
            world.accounts[order.customer_key] = paid.state
        assert paid.reply is not None
        response = HttpResponse(paid.reply.status, paid.reply.body)
        result = orders_endpoint.handle(order, PaymentResult(key), _context(http_response=response))
        world.orders[key] = result.state
        if result.api_call is not None:  # the carrier books the paid order's shipment
            booked_answer = HttpResponse(201, {"id": f"shipment-{key}"})
            world.orders[key] = orders_endpoint.handle(
                result.state, result.api_call.follow_up,
                _context(http_response=booked_answer)).state
        for out in result.outgoing:
            customer = out.message.customer_key  # type: ignore[attr-defined]
            booked = ledger_endpoint.handle(world.ledgers.get(customer), out.message, _context())
            world.ledgers[customer] = booked.state
    return world


def write_input(directory: Path, order_keys: list[int]) -> Path:
    """TPC-H sf=0.001 restricted to `order_keys` (all customers) as the audit's input."""
    full = directory / "full"
    export_tables(SF, full)
    target = directory / "input"
    target.mkdir(parents=True, exist_ok=True)
    keys = ", ".join(str(k) for k in order_keys)
    with duckdb.connect() as con:
        for table, column in (("orders", "o_orderkey"), ("lineitem", "l_orderkey")):
            con.execute(f"COPY (SELECT * FROM '{full}/{table}.parquet' WHERE {column} IN "
                        f"({keys})) TO '{target}/{table}.parquet' (FORMAT parquet)")
        con.execute(f"COPY (SELECT * FROM '{full}/customer.parquet') TO "
                    f"'{target}/customer.parquet' (FORMAT parquet)")
    return target


async def fresh_database(server_dsn: str, name: str) -> str:
    """Drop and re-create database `name` on the server, migrate it; returns its DSN."""
    dsn = with_database(server_dsn, name)
    await drop_database(dsn)
    await ensure_database(dsn)
    await upgrade_async(dsn)
    return dsn


async def store(dsn: str, world: World) -> None:
    """The settled states as idle transaction records (the JSONB the real store writes)."""
    rows: list[tuple[str, str, Any]] = []
    rows += [("orders", str(k), to_jsonable(o)) for k, o in world.orders.items()]
    rows += [("payments", str(k), to_jsonable(a)) for k, a in world.accounts.items()]
    rows += [("ledger", str(k), to_jsonable(b)) for k, b in world.ledgers.items()]
    conn = await asyncpg.connect(dsn)
    try:
        await conn.set_type_codec("jsonb", encoder=_dumps, decoder=_loads, schema="pg_catalog")
        await conn.executemany(
            "INSERT INTO eo_transaction_record (endpoint, partition_key, version, state) "
            "VALUES ($1, $2, 3, $3)", rows)
    finally:
        await conn.close()


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value)


def _loads(text: str) -> Any:
    import json

    return json.loads(text)


def s3_client(endpoint_url: str) -> Any:
    """A boto3 client of the moto server."""
    return boto3.client("s3", endpoint_url=endpoint_url, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


def put_invoices(endpoint_url: str, bucket: str, world: World) -> None:
    """Create `bucket` (if needed) and put every invoice of `world` into it."""
    client = s3_client(endpoint_url)
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", ())}
    if bucket not in existing:
        client.create_bucket(Bucket=bucket)
    for key, content in world.invoices.items():
        client.put_object(Bucket=bucket, Key=key, Body=content)


def doubled_line(order: Order) -> Order:
    """`order` with its first line stored twice (a doubled AddItem)."""
    return replace(order, lines=(order.lines[0], *order.lines))


def missing_line(order: Order) -> Order:
    """`order` with its last line lost (a lost AddItem); the total is left as it was."""
    return replace(order, lines=order.lines[:-1])


def last_line_number(world: World, order_key: int) -> int:
    """The line number `missing_line` dropped from the order `order_key` of `world`: the
    highest one the oracle keeps."""
    return world.sample.expected[order_key].lines[-1]


def wrong_total(order: Order) -> Order:
    """`order` with a total one cent off."""
    assert order.total is not None
    return replace(order, total=order.total + Decimal("0.01"))


def doubled_confirmation(book: CustomerLedger, order: Order) -> CustomerLedger:
    """`book` with `order`'s confirmation recorded a second time (revenue counted twice)."""
    assert order.total is not None
    return replace(book, revenue=book.revenue + order.total,
                   confirmed=tuple(sorted((*book.confirmed, order.order_key))))
