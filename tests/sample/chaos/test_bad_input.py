"""The bad-input campaign (issue 5): a few hundred hypothesis-generated deliveries, most of
them malformed, published to the work queues of real `eo consume` processes (gateway,
orders, ledger) on PostgreSQL and RabbitMQ. At quiescence every process is still alive,
every delivery ended processed, duplicate or dead-lettered with a reason naming the cause
(protocol 7, invariant I10), the counts add up to what was sent, and the valid messages
mixed in had their effect, once.

How the campaign is generated (tests/sample/support/bad_input.py). `delivery_specs` is one
hypothesis strategy over every kind of input (random bytes, invalid JSON, JSON of the wrong
shape, unknown or missing type, missing, garbage or non-canonical message IDs, oversized
bodies, header values of every AMQP type, valid messages of the wrong endpoint, handler
rejections, useless request URLs, text PostgreSQL cannot store, valid messages and duplicated
valid messages); `campaign()` collects the examples of one hypothesis run at a fixed `@seed`,
so every run sends the same campaign. Shrinking is not used: one campaign costs seconds of
processes and broker, and the deliveries are independent of each other (each has its own
message ID and partition), so a failure is reported per delivery, with everything that was
sent, which is already the minimal reproducer. `EO_TEST_BADINPUT_SEED` draws another one.

The processes run on the database `eo_badinput_campaign_<pid>` and the RabbitMQ virtual host
`eo-badinput-<pid>`, with `EO_MAX_BODY_BYTES=2048`, two retry delays of 0.05 and 0.1 s and two
attempts; the payments callee runs in the orders process (`EO_CALLEES__PAYMENTS__URL`
unset). The valid
messages never complete an order, so the callee only hears of requests it does not know (the
follow-ups with useless request URLs).
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import aio_pika
import asyncpg
import httpx
import pytest

from adapters.http.client import HttpxRequests
from adapters.memory.broker import MemoryBroker
from adapters.memory.http import InProcessHttp
from adapters.postgres.pool import create_pool
from adapters.postgres.token_store import PostgresTokenStore
from adapters.rabbitmq.dispatcher import attempt_of, text_headers
from application.codec import encode
from application.envelope import (
    ATTEMPTS_HEADER,
    ENDPOINT_HEADER,
    REASON_HEADER,
    REQUEST_URL_HEADER,
    Envelope,
)
from application.errors import PermanentError
from application.outcome import Outcome
from application.workers import Workers
from domain.context import Context
from domain.sample import ledger as ledger_domain
from domain.sample import orders as orders_domain
from domain.sample.ledger import CustomerLedger
from domain.sample.messages import (
    OrderConfirmed,
    OrderRejected,
    PlaceOrder,
)
from domain.sample.orders import Order
from entrypoints.settings import DEFAULT_SERVICE
from tests.sample.support.bad_input import (
    DEAD,
    DUPLICATE,
    ENDPOINTS,
    KEY_BASE,
    PROCESSED,
    SEED,
    SEQ_HEADER,
    Planned,
    campaign,
    materialise,
)
from tests.sample.support.system import sample_system
from tests.support.processes import (
    Fleet,
    Rabbit,
    Where,
    fresh_fleet,
    metric,
    publisher,
    states,
    unfinished,
    where_for,
)

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

DATABASE = "eo_badinput_campaign"
VHOST = "eo-badinput"


# ---------------------------------------------------------------------------------------------
# the processes and the publication


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with where_for(DATABASE, VHOST) as found:
        yield found


@pytest.fixture
async def fleet(where: Where, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with fresh_fleet(where, tmp_path, pool_size=2, service=DEFAULT_SERVICE,
                           endpoints=ENDPOINTS) as started:
        yield started


@pytest.fixture
async def rabbit(where: Where) -> AsyncIterator[Rabbit]:
    async with publisher(where) as connected:
        yield connected


@pytest.fixture
async def pool(where: Where) -> AsyncIterator[asyncpg.Pool]:
    created = await create_pool(where.dsn, max_size=2)
    try:
        yield created
    finally:
        await created.close()


async def publish(plan: list[Planned], rabbit: Rabbit, pool: asyncpg.Pool) -> None:
    """Create the senders' tokens, then publish every delivery (copies of one message
    concurrently with the rest): with aio-pika and publisher confirms, or with pika for
    those without a message ID."""
    tokens = PostgresTokenStore(pool)
    for p in plan:
        if p.spec.token and p.uuid is not None:  # addressed to the endpoint it goes to
            await tokens.create(p.spec.endpoint, [Envelope(
                p.uuid, p.spec.type or "", p.body, MappingProxyType(dict(p.spec.token_headers)))])
    sends = []
    for p in plan:
        for seq in p.seqs:
            headers = {**p.spec.headers, SEQ_HEADER: str(seq)}
            if p.message_id is None:
                sends.append(asyncio.to_thread(rabbit.publish_without_message_id,
                                               p.spec.endpoint, p.body, p.spec.type, headers))
            else:
                sends.append(rabbit.publish(p.spec.endpoint, p.body, p.message_id,
                                            p.spec.type, headers))
    for batch in range(0, len(sends), 100):
        await asyncio.gather(*sends[batch:batch + 100])


# ---------------------------------------------------------------------------------------------
# what happened


@dataclass
class Observed:
    """Outcomes seen so far: dead letters taken off the dead-letter queues (by endpoint), and
    per endpoint the protocol events of the processes' logs counted by message ID."""

    dead: dict[str, list[aio_pika.abc.AbstractIncomingMessage]] = field(
        default_factory=lambda: {e: [] for e in ENDPOINTS})
    events: dict[str, dict[str, Counter[str]]] = field(default_factory=dict)

    def by_seq(self) -> dict[int, tuple[str, aio_pika.abc.AbstractIncomingMessage]]:
        found = {}
        for endpoint, messages in self.dead.items():
            for message in messages:
                seq = (message.headers or {}).get(SEQ_HEADER)
                if isinstance(seq, str) and seq.isdigit():
                    found[int(seq)] = (endpoint, message)
        return found

    def count(self, endpoint: str, event: str, message_id: uuid.UUID | str | None) -> int:
        if message_id is None:
            return 0
        return self.events.get(endpoint, {}).get(event, Counter())[str(message_id)]

    def in_flight(self) -> list[str]:
        """Message IDs received by a process and not yet settled (no processed, duplicate,
        retried or dead-lettered event for that reception)."""
        busy = []
        for endpoint, events in self.events.items():
            for message_id, received in events.get("message.received", Counter()).items():
                settled = sum(events.get(name, Counter())[message_id] for name in (
                    "transaction.committed", "message.duplicate", "message.retried",
                    "message.dead_lettered"))
                if received > settled:
                    busy.append(f"{endpoint}:{message_id}")
        return busy


async def observe(fleet: Fleet, rabbit: Rabbit, seen: Observed) -> None:
    """Take the new dead letters and re-count the processes' log events."""
    for endpoint in ENDPOINTS:
        seen.dead[endpoint] += await rabbit.take(f"{endpoint}.dlq", 10_000)
    for proc in fleet.procs:
        endpoint = proc.name.rsplit("-", 1)[0]
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        for entry in await asyncio.to_thread(proc.entries):
            if "message_id" in entry:
                counts[str(entry.get("event"))][str(entry["message_id"])] += 1
        seen.events[endpoint] = counts


def outcomes(p: Planned, seen: Observed, dead: Mapping[int, Any]) -> Counter[str]:
    """How the deliveries of `p` ended: dead letters matched by sequence number; processed
    (a committed transaction) and duplicates counted by message ID in the endpoint's log."""
    ended: Counter[str] = Counter()
    ended[DEAD] = sum(seq in dead for seq in p.seqs)
    ended[PROCESSED] = seen.count(p.spec.endpoint, "transaction.committed", p.uuid)
    ended[DUPLICATE] = seen.count(p.spec.endpoint, "message.duplicate", p.uuid)
    return +ended


def expected(p: Planned) -> Counter[str]:
    if p.spec.expect == PROCESSED:
        return +Counter({PROCESSED: 1, DUPLICATE: p.spec.copies - 1})
    return Counter({p.spec.expect: p.spec.copies})


async def relayed_ids(pool: asyncpg.Pool) -> dict[str, uuid.UUID]:
    """The gateway's relays: incoming message ID -> the ID of the message it sent to orders."""
    rows = await pool.fetch("SELECT message_id, outgoing FROM eo_processed_message "
                            "WHERE endpoint = 'gateway'")
    relays = {}
    for row in rows:
        [out] = row["outgoing"]
        relays[str(row["message_id"])] = uuid.UUID(out["message_id"])
    return relays


def expected_state(message: Any) -> Any:
    """The state one valid message makes of a new partition (the handlers are pure)."""
    context = Context(uuid.UUID(int=0), uuid.UUID(int=1), datetime(2026, 1, 1, tzinfo=UTC))
    handle = ledger_domain.handle if isinstance(message, OrderConfirmed | OrderRejected) \
        else orders_domain.handle
    return handle(None, message, context).state


def figures(plan: list[Planned], seen: Observed, dead: Mapping[int, Any]) -> str:
    """Deliveries sent by kind and by endpoint, and how they ended."""
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    by_endpoint: dict[str, Counter[str]] = defaultdict(Counter)
    for p in plan:
        ended = outcomes(p, seen, dead)
        for row in (by_kind[p.spec.kind], by_endpoint[p.spec.endpoint]):
            row["sent"] += p.spec.copies
            row.update(ended)
    total = sum(by_kind.values(), Counter())
    lines = []
    for title, table in (("kind", by_kind), ("endpoint", by_endpoint)):
        lines.append(f"{title:<22}{'sent':>6}{PROCESSED:>11}{DUPLICATE:>11}"
                     f"{'dead-lettered':>15}")
        for name, row in [*sorted(table.items()), ("total", total)]:
            lines.append(f"{name:<22}{row['sent']:>6}{row[PROCESSED]:>11}{row[DUPLICATE]:>11}"
                         f"{row[DEAD]:>15}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the campaign


async def test_a_campaign_of_bad_input_ends_processed_duplicate_or_dead_lettered(
    fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool,
) -> None:
    """Publish the campaign to the three endpoints' processes, wait for quiescence, then
    check: the processes never died nor restarted; each delivery ended as its kind says
    (processed once with the other copies duplicates, all duplicates, or all dead-lettered
    with an `eo-reason` naming the cause and `eo-endpoint`); the dead-letter queues hold
    nothing else; the processes' own counts (metrics before, `consumer.stopped` after a
    SIGTERM) add up to what was sent; and the valid messages changed state exactly as their
    handler says, the gateway's through its relay to orders."""
    # the campaign's own header tells its copies apart: kept, as a service keeps trace IDs
    kept = {"EO_KEPT_HEADERS": json.dumps([SEQ_HEADER])}
    procs = {e: fleet.start(e, **kept) for e in ENDPOINTS}  # they start while generating
    plan = materialise(await asyncio.to_thread(campaign))
    await fleet.ready(*procs.values(), timeout_s=90)
    pids = {e: p.popen.pid for e, p in procs.items()}
    await publish(plan, rabbit, pool)
    gateway_valid = [p for p in plan if p.spec.endpoint == "gateway"
                     and p.spec.expect == PROCESSED]

    seen = Observed()

    async def quiescent() -> bool:
        await observe(fleet, rabbit, seen)
        dead = seen.by_seq()
        if any(sum(outcomes(p, seen, dead).values()) < p.spec.copies for p in plan):
            return False
        relays = await relayed_ids(pool)
        if len(relays) < len(gateway_valid) or any(
                not seen.count("orders", "transaction.committed", r) for r in relays.values()):
            return False
        depths = [await rabbit.depths(e) for e in ENDPOINTS]
        return not seen.in_flight() and not any(
            n for d in depths for name, n in d.items() if not name.endswith(".dlq"))

    deadline = asyncio.get_running_loop().time() + 60
    while not await quiescent():
        if dead_procs := [p.name for p in procs.values() if not p.alive()]:
            pytest.fail(f"{dead_procs} exited during the campaign\n{fleet.tails()}")
        if asyncio.get_running_loop().time() > deadline:
            dead = seen.by_seq()
            stuck = [(p.index, p.spec.kind, p.spec.endpoint, dict(outcomes(p, seen, dead)))
                     for p in plan if sum(outcomes(p, seen, dead).values()) < p.spec.copies]
            relays = await relayed_ids(pool)
            unrelayed = [r for r in relays.values()
                         if not seen.count("orders", "transaction.committed", r)]
            depths = [await rabbit.depths(e) for e in ENDPOINTS]
            pytest.fail(f"no quiescence after 60 s: unresolved {stuck[:20]}, in flight "
                        f"{seen.in_flight()[:20]}, relays {len(relays)} of "
                        f"{len(gateway_valid)}, not committed by orders {unrelayed[:5]}, "
                        f"queues {depths}\n{fleet.tails()}")
        await asyncio.sleep(0.3)

    # no process crashed or restarted
    for endpoint, proc in procs.items():
        assert proc.alive(), proc.tail()
        assert proc.popen.pid == pids[endpoint]
        assert len(proc.events("consumer.started")) == 1, proc.tail()
    # EO_PREFETCH unset: the prefetch is each endpoint's (Settings.prefetch_for)
    started = {e: proc.events("consumer.started")[0] for e, proc in procs.items()}
    assert {e: (s["prefetch"], s["batch_size"]) for e, s in started.items()} == {
        e: (150, 50) if s["strategy"] == "token" else (8, 1) for e, s in started.items()}
    assert {s["strategy"] for s in started.values()} == {"token", "outbox"}
    assert len(fleet.procs) == len(ENDPOINTS)

    # every delivery ended as its kind says; dead letters say why and where
    dead = seen.by_seq()
    report = figures(plan, seen, dead)
    wrong = []
    for p in plan:
        if outcomes(p, seen, dead) != expected(p):
            reasons = [(dead[s][1].headers or {}).get(REASON_HEADER) for s in p.seqs if s in dead]
            wrong.append(f"#{p.index} {p.spec}: ended {dict(outcomes(p, seen, dead))}, "
                         f"expected {dict(expected(p))}, reasons {reasons}")
            continue
        for s in p.seqs:
            if s not in dead:
                continue
            endpoint, message = dead[s]
            headers = message.headers or {}
            reason = headers.get(REASON_HEADER)
            sent = text_headers({**p.spec.headers, SEQ_HEADER: str(s)})
            if (endpoint != p.spec.endpoint or headers.get(ENDPOINT_HEADER) != endpoint
                    or not isinstance(reason, str) or not re.search(p.spec.reason, reason, re.S)
                    or headers.get(ATTEMPTS_HEADER) != str(attempt_of(sent))):
                wrong.append(f"#{p.index} {p.spec}: dead letter on {endpoint} with "
                             f"{ {k: v for k, v in headers.items() if k.startswith('eo-')} }")
    assert not wrong, "\n".join([report, *wrong[:15]])
    ours = set(dead)
    strays = [(e, m.message_id, (m.headers or {}).get(REASON_HEADER))
              for e, messages in seen.dead.items() for m in messages
              if (m.headers or {}).get(SEQ_HEADER) is None
              or int(str((m.headers or {}).get(SEQ_HEADER))) not in ours]
    assert not strays, f"dead letters not sent by the campaign: {strays[:10]}"
    assert len(ours) == sum(len(m) for m in seen.dead.values())  # none twice

    # the gateway's valid commands were relayed once each, and orders processed the relay
    relays = await relayed_ids(pool)
    assert set(relays) == {str(p.uuid) for p in gateway_valid}
    relayed = set(map(str, relays.values()))
    for r in relayed:
        assert seen.count("orders", "transaction.committed", r) == 1, r
    mine = {str(p.uuid) for p in plan if p.uuid is not None}
    for endpoint in ENDPOINTS:
        received = set(seen.events[endpoint].get("message.received", Counter()))
        known = mine | (relayed if endpoint == "orders" else set())
        assert received <= known, f"{endpoint} received unknown IDs {received - known}"

    # the processes' own counts: the metrics agree with the logs and the dead-letter queues
    sent_to: Counter[str] = Counter()
    for p in plan:
        sent_to[p.spec.endpoint] += p.spec.copies
    relay_copies = sum(seen.count("orders", name, r) for r in relayed
                       for name in ("transaction.committed", "message.duplicate"))
    for endpoint, proc in procs.items():
        status, scrape = await asyncio.to_thread(proc.get, "/metrics")
        assert status == 200
        events = seen.events[endpoint]
        for name in ("transaction.committed", "message.duplicate", "message.dead_lettered"):
            assert metric(scrape, endpoint, name) == sum(events.get(name, Counter()).values()), (
                endpoint, name)
        assert metric(scrape, endpoint, "message.dead_lettered") == len(seen.dead[endpoint])

    # after SIGTERM: processed + duplicate + dead-lettered (+ refused at the source) = sent
    for proc in procs.values():
        proc.popen.send_signal(signal.SIGTERM)
    for endpoint, proc in procs.items():
        assert await fleet.exit_code(proc, 20) == 0, proc.tail()
        [stopped] = proc.events("consumer.stopped")
        settled = sum(stopped.get(k, 0) for k in (PROCESSED, DUPLICATE, DEAD))
        arrived = sent_to[endpoint] + (relay_copies if endpoint == "orders" else 0)
        assert (settled, stopped.get("unsettled", 0)) == (arrived, 0), (endpoint, stopped)
        assert stopped.get(DEAD, 0) == len(seen.dead[endpoint])
    for endpoint in ENDPOINTS:
        assert sum((await rabbit.depths(endpoint)).values()) == 0, endpoint

    # the valid messages' effects, once; nothing else changed state
    want_orders = {str(KEY_BASE + p.index): expected_state(p.message) for p in plan
                   if p.spec.expect == PROCESSED and p.spec.endpoint in ("gateway", "orders")}
    want_ledger = {str(KEY_BASE + p.index): expected_state(p.message) for p in plan
                   if p.spec.expect == PROCESSED and p.spec.endpoint == "ledger"}
    assert await states(pool, "orders", Order) == want_orders
    assert await states(pool, "ledger", CustomerLedger) == want_ledger
    assert await unfinished(pool) == 0
    # the tokens of dead letters stay for a replay (protocol 7); processed ones are consumed
    left = {row["message_id"] for row in await pool.fetch("SELECT message_id FROM eo_token")}
    assert left == {p.uuid for p in plan if p.spec.token and p.spec.expect == DEAD}
    print(f"\nbad-input campaign, seed {SEED}:\n{report}")


# ---------------------------------------------------------------------------------------------
# found by the campaign's design, checked in process (memory adapters)


def _embedded() -> Workers:
    return sample_system()


async def test_a_gateway_command_with_a_stray_request_url_header_is_still_relayed() -> None:
    """An outside producer's command that happens to carry `eo-request-url` (a header of
    the HTTP follow-ups between our own endpoints) must be processed like any command:
    relayed to orders once, never dropped as a duplicate."""
    system = _embedded()
    command = PlaceOrder(KEY_BASE, 7, datetime(2026, 1, 2).date(), "1-URGENT", 2)
    envelope = Envelope(uuid.uuid4(), "PlaceOrder", encode(command), MappingProxyType(
        {REQUEST_URL_HEADER: f"inproc://payments/requests/{uuid.uuid4()}"}))
    outcome = await system.processor("gateway").process(envelope)
    assert outcome is Outcome.PROCESSED
    assert isinstance(system.dispatcher, MemoryBroker)
    assert system.dispatcher.depth("orders") == 1


async def test_an_outside_command_cannot_make_the_gateway_send_the_callee_token_elsewhere(
) -> None:
    """With the payments callee reached over HTTP, a command carrying `eo-request-url` must
    not make the gateway call that URL: no request may leave for a host that is not the
    configured callee, least of all with `Authorization: Bearer <payments token>`."""
    sent: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(404, json={"error": "unknown"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(record)) as client:
        callee = "http://payments.internal:8470"
        system = sample_system(http=HttpxRequests(client, {callee: "payments-secret"}),
                               urls={"payments": callee})
        command = PlaceOrder(KEY_BASE, 7, datetime(2026, 1, 2).date(), "1-URGENT", 2)
        await system.processor("gateway").process(Envelope(
            uuid.uuid4(), "PlaceOrder", encode(command),
            MappingProxyType({REQUEST_URL_HEADER: "http://collector.example/requests/x"})))
    assert [str(r.url) for r in sent if r.url.host != "payments.internal"] == []


async def test_a_request_url_without_a_request_id_is_a_permanent_error() -> None:
    """A follow-up whose request URL has no UUID where the request ID goes cannot be
    answered by any retry: `PermanentError` (dead letter at once), not the `ValueError` that
    the consumer retried until "retries exhausted"."""
    http = InProcessHttp({"payments": _embedded().callees["payments"]})
    for url in ("inproc://payments/requests/not-a-uuid", "inproc://payments/requests/"):
        with pytest.raises(PermanentError, match="no request ID"):
            await http.post(url)
        with pytest.raises(PermanentError, match="no request ID"):
            await http.delete(url)
