"""One order, one trace: the sample's processes (`eo consume` gateway, orders and ledger, `eo
serve` payments) on PostgreSQL and RabbitMQ, each exporting its spans over OTLP
(`OTEL_TRACES_EXPORTER=otlp`) to a receiver in this test. A producer sends an order's
commands under its own trace context; every span the order causes, in every process (the
protocol's steps, the HTTP calls to the payments callee on both sides, the statements), is in
that trace, and the tree is connected: each span's parent was received, or is the
producer's."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from adapters.postgres.pool import create_pool
from adapters.system.clock import SystemClock
from application.codec import encode
from application.envelope import TRACEPARENT_HEADER
from domain.sample.payments import open_account
from entrypoints.local import postgres_stores
from entrypoints.settings import DEFAULT_SERVICE
from service.registry import REGISTRY
from tests.support.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.support.processes import Where, calling, fresh_fleet, publisher, where_for
from tools.tpch.data import generate

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

TOKEN = "traces-test-token"
PRODUCER_TRACE = "5b8efff798038103d269b633813fc60c"
PRODUCER_SPAN = "eee19b7ec3c1b174"


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with where_for("eo_traces", "eo-traces") as found:
        yield found


def tree(spans: list[ReceivedSpan], root: str) -> list[str]:
    """The spans under parent `root`, indented, each `service: name` (children in the order
    received)."""
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for span in spans:
            if span.parent_id == parent:
                lines.append(f"{'  ' * depth}{span.service}: {span.name}")
                walk(span.span_id, depth + 1)

    walk(root, 0)
    return lines


async def _spans_until(receiver: OtlpReceiver, services: set[str], timeout_s: float
                       ) -> list[ReceivedSpan]:
    deadline = time.monotonic() + timeout_s
    while True:
        ours = [s for s in receiver.received() if s.trace_id == PRODUCER_TRACE]
        if {s.service for s in ours if s.name == f"process {s.service}"} >= services:
            return ours
        if time.monotonic() > deadline:
            pytest.fail(f"no process span of {services - {s.service for s in ours}} in the "
                        f"order's trace after {timeout_s} s; received "
                        f"{Counter((s.service, s.name) for s in ours)}")
        await asyncio.sleep(0.2)


async def test_one_order_forms_one_trace_across_every_process(where: Where,
                                                              tmp_path: Path) -> None:
    sample = generate(0.001)
    order = sample.commands[0].message.order_key  # type: ignore[attr-defined]
    commands = [c for c in sample.commands
                if c.message.order_key == order]  # type: ignore[attr-defined]
    customer = sample.order_customers[order]
    balance = dict(sample.customers)[customer]
    with otlp_receiver() as receiver:
        async with fresh_fleet(where, tmp_path, service=DEFAULT_SERVICE,
                               endpoints=("gateway", "orders", "ledger")) as fleet:
            pool = await create_pool(where.dsn, max_size=1)
            try:
                await postgres_stores(pool, SystemClock(), REGISTRY)["payments"].seed_states(
                    {str(customer): open_account(customer, balance, Decimal(10**6))})
            finally:
                await pool.close()
            payments = fleet.serve("payments", TOKEN, **receiver.env("payments"))
            await fleet.ready(payments, timeout_s=60)
            assert payments.url is not None
            procs = [fleet.start("gateway", **receiver.env("gateway")),
                     fleet.start("orders", **receiver.env("orders"),
                                 **calling("payments", payments.url, TOKEN)),
                     fleet.start("ledger", **receiver.env("ledger"))]
            await fleet.ready(*procs, timeout_s=60)
            traceparent = f"00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"
            async with publisher(where) as rabbit:
                for command in commands:  # the producer's order, under its span
                    await rabbit.publish("gateway", encode(command.message),
                                         str(command.message_id),
                                         type(command.message).__name__,
                                         {TRACEPARENT_HEADER: traceparent})
            ours = await _spans_until(receiver, {"gateway", "orders", "payments", "ledger"},
                                      90)
            for proc in fleet.procs:  # a graceful stop flushes what is left to export
                proc.popen.terminate()
            for proc in fleet.procs:
                assert await fleet.exit_code(proc, 30) == 0, proc.tail()
            committed = [e for p in fleet.procs for e in p.events("transaction.committed")]
        ours = [s for s in receiver.received() if s.trace_id == PRODUCER_TRACE]
    # the log lines of the order's processing carry its trace and their span
    assert committed
    assert {e.get("trace_id") for e in committed} == {PRODUCER_TRACE}
    assert {e["span_id"] for e in committed} <= {s.span_id for s in ours}
    shown = "\n".join(tree(ours, PRODUCER_SPAN))
    print(f"\nthe order's trace ({len(ours)} spans):\n{shown}")
    names = Counter((s.service, s.name) for s in ours)
    for service in ("gateway", "orders", "payments", "ledger"):
        assert names[(service, f"process {service}")] >= 1, names
    # both sides of the HTTP calls to the callee: httpx's client spans in orders, FastAPI's
    # server spans in payments, the callee's processing inside the POST
    assert any(s.service == "orders" and s.name in {"PUT", "POST"} for s in ours), names
    assert any(s.service == "payments" and s.name.startswith("POST /requests") for s in ours)
    assert any(s.service == "orders" and s.name == "create http_request" for s in ours)
    assert any(s.name.startswith("publish") and s.service == "orders" for s in ours), names
    assert any(s.attributes.get("db.system") == "postgresql"
               or s.attributes.get("db.system.name") == "postgresql" for s in ours), names
    # one tree: every span's parent is in it, or is the producer's span
    ids = {s.span_id for s in ours} | {PRODUCER_SPAN}
    orphans = [(s.service, s.name) for s in ours if s.parent_id not in ids]
    assert orphans == [], orphans
    assert len(tree(ours, PRODUCER_SPAN)) == len(ours)
