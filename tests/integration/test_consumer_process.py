"""`eo consume` and `eo serve` as real processes of the counters service.

Bad input dead-lettered with its reason while the consumer goes on, graceful shutdown on
SIGTERM, recovery from SIGKILL (with `bank` served by `eo serve` over HTTP), two consumers of
one endpoint on one host with default settings, and `eo migrate` / `eo inspect`.

The processes share a database of this module's own (`eo_it_consumer_process_<pid>`) and,
where the broker is local and `rabbitmqctl` works, a RabbitMQ virtual host of its own, so
the fixed queue names (`counter`, ...) cannot collide with other users of the broker or
another run. Each test starts from deleted queues and empty tables. Every amount a test
sends to one counter is a distinct power of two, so a total says which messages were
applied and a message applied twice shows. The process helpers live in
tests/support/processes.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType

import asyncpg
import pytest
from typer.testing import CliRunner

from adapters.localfs.blob_store import LocalDirectoryBlobStore
from adapters.postgres.migrate import head_revision, upgrade
from adapters.postgres.token_store import PostgresTokenStore
from adapters.rabbitmq import topology
from application.codec import encode, to_jsonable
from application.envelope import (
    ATTEMPTS_HEADER,
    ENDPOINT_HEADER,
    REASON_HEADER,
    TOKEN_HEADER,
    Envelope,
)
from entrypoints.cli import app
from entrypoints.version import TEMPLATE_VERSION, service_version
from tests.support.counters.endpoints import Account, Add, AuditLog, Spend, Tally
from tests.support.counters.registry import SPEC
from tests.support.processes import (
    CONSUMING,
    DELAYS,
    DELIVERY_LIMIT,
    MAX_BODY_BYTES,
    TABLES,
    Fleet,
    Rabbit,
    Where,
    calling,
    drop_database,
    ensure_database,
    fresh_fleet,
    logged_at,
    metric,
    states,
    unfinished,
    until,
    where_for,
    with_database,
)

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

DATABASE = "eo_it_consumer_process"
VHOST = "eo-it-consumer-process"
BANK_TOKEN = "consumer-process-bank-token"


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with where_for(DATABASE, VHOST) as found:
        yield found


@pytest.fixture
async def fleet(where: Where, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with fresh_fleet(where, tmp_path, pool_size=3) as started:
        yield started


def token_envelope(message: object, type_: str | None = None, body: bytes | None = None,
                   ) -> Envelope:
    """What a token-based sender sends (its token is the test's to create)."""
    return Envelope(uuid.uuid4(), type_ or type(message).__name__,
                    encode(message) if body is None else body,
                    MappingProxyType({TOKEN_HEADER: "1"}))


def natural_id(message: Add | Spend) -> str:
    """An outside producer's message ID: derived from the business key (protocol 4)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL,
                          f"{type(message).__name__}/{message.counter}/{message.amount}"))


async def publish_with_tokens(rabbit: Rabbit, tokens: PostgresTokenStore, queue: str,
                              envelopes: list[Envelope]) -> None:
    """Create the tokens, then publish (in batches of 200, each waiting for its confirms)."""
    await tokens.create(queue, envelopes)
    for batch in range(0, len(envelopes), 200):
        await asyncio.gather(*(
            rabbit.publish(queue, e.body, str(e.message_id), e.type, dict(e.headers))
            for e in envelopes[batch:batch + 200]))


# ---------------------------------------------------------------------------------------------
# bad input


async def test_bad_input_is_dead_lettered_with_its_reason_and_the_consumer_goes_on(
    fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool,
) -> None:
    counter = fleet.start("counter")
    await fleet.ready(counter)
    tokens = PostgresTokenStore(pool)
    not_json = token_envelope(None, "Add", b'{"counter": "c", ')
    unknown = token_envelope(None, "Frobnicate", b"{}")
    negative = token_envelope(Add("n", -4))  # another partition: rejected on its own
    good = token_envelope(Add("c", 8))
    await tokens.create("counter", [not_json, unknown, negative, good])  # the senders' tokens
    no_token_header = encode(Add("c", 16))
    oversized = b'{"pad": "' + b"x" * (2 * MAX_BODY_BYTES) + b'"}'
    token = {TOKEN_HEADER: "1"}
    ids = {name: str(uuid.uuid4()) for name in ("no_token_header", "oversized")}

    for sent in (not_json, unknown, negative):
        await rabbit.publish("counter", sent.body, str(sent.message_id), sent.type, token)
    await rabbit.publish("counter", no_token_header, ids["no_token_header"], "Add")
    await rabbit.publish("counter", oversized, ids["oversized"], "Add", token)
    await asyncio.to_thread(rabbit.publish_without_message_id, "counter",
                            encode(Add("c", 32)), "Add")
    await rabbit.publish("counter", good.body, str(good.message_id), "Add", token)

    async def settled() -> bool:
        return (await rabbit.depth("counter.dlq") == 6
                and not await tokens.exists("counter", good.message_id))

    await until(settled, 20, "6 dead letters and the valid message processed", fleet, rabbit)
    dead = await rabbit.take("counter.dlq", 6)
    ours = {str(not_json.message_id), str(unknown.message_id), str(negative.message_id),
            *ids.values()}
    # the copy of the message without an ID gets a random one from aiormq on its way to the
    # DLQ: key it as None
    reasons = {m.message_id if m.message_id in ours else None:
               str((m.headers or {}).get(REASON_HEADER)) for m in dead}
    assert set(reasons) == {*ours, None}, reasons
    assert reasons[str(not_json.message_id)].startswith("malformed Add")
    assert reasons[str(unknown.message_id)] == "unknown message type 'Frobnicate'"
    assert reasons[str(negative.message_id)] == "rejected by handler: negative amount -4"
    assert reasons[ids["no_token_header"]].startswith("no token header")
    assert reasons[ids["oversized"]] == (f"body of {len(oversized)} bytes exceeds the limit "
                                         f"of {MAX_BODY_BYTES}")
    assert reasons[None] == "no message_id"
    for message in dead:
        headers = message.headers or {}
        assert (headers.get(ENDPOINT_HEADER), headers.get(ATTEMPTS_HEADER)) == ("counter", "1")
    # the tokens of dead letters stay (a replay from the DLQ is processed normally)
    for kept in (not_json, unknown, negative):
        assert await tokens.exists("counter", kept.message_id)
    assert await tokens.count() == 3

    row = await pool.fetchrow("SELECT message_id FROM eo_transaction_record "
                              "WHERE endpoint = 'counter' AND partition_key = 'c'")
    assert row is not None
    assert row["message_id"] is None  # committed and finished
    tallies = await states(pool, "counter", Tally)
    assert list(tallies) == ["c"]  # nothing but the valid message changed a state
    tally = tallies["c"]
    assert (tally.total, tally.applied) == (8, (str(good.message_id),))
    blobs = LocalDirectoryBlobStore(fleet.blob_dir)
    assert await blobs.keys() == list(tally.receipts)  # its receipt, and no other blob
    assert await rabbit.depths("counter") == {
        "counter": 0, "counter.retry.50ms": 0, "counter.retry.100ms": 0, "counter.dlq": 0}

    assert counter.alive(), counter.tail()
    status, body = await asyncio.to_thread(counter.get, "/ready")
    assert (status, json.loads(body)) == (200, {"consuming": True, "publishing": True,
                                                "dead_letter_queue": True, "postgres": True})
    status, scrape = await asyncio.to_thread(counter.get, "/metrics")
    assert status == 200
    assert metric(scrape, "counter", "transaction.committed") == 1
    # the four the processor judged and the two the source refused
    assert metric(scrape, "counter", "message.dead_lettered") == 6

    counter.popen.send_signal(signal.SIGTERM)
    assert await fleet.exit_code(counter, 10) == 0, counter.tail()
    [stopped] = counter.events("consumer.stopped")
    # every delivery accounted for, in one vocabulary: the two the source refused before
    # processing are dead-lettered as the four the processor judged
    assert (stopped.get("processed", 0), stopped.get("duplicate", 0),
            stopped.get("dead_lettered", 0), stopped.get("rejected")) == (1, 0, 6, None), stopped


async def test_every_dead_letter_is_counted_in_the_metrics(
    fleet: Fleet, rabbit: Rabbit,
) -> None:
    counter = fleet.start("counter")
    await fleet.ready(counter)
    oversized = b'{"pad": "' + b"x" * (2 * MAX_BODY_BYTES) + b'"}'
    await rabbit.publish("counter", oversized, str(uuid.uuid4()), "Add", {TOKEN_HEADER: "1"})
    await asyncio.to_thread(rabbit.publish_without_message_id, "counter",
                            encode(Add("c", 1)), "Add")

    async def dead_lettered() -> bool:
        return await rabbit.depth("counter.dlq") == 2

    await until(dead_lettered, 20, "2 dead letters", fleet)
    status, scrape = await asyncio.to_thread(counter.get, "/metrics")
    assert status == 200
    assert metric(scrape, "counter", "message.dead_lettered") == 2, scrape
    assert len(counter.events("message.dead_lettered")) == 2


async def test_a_replayed_dead_letter_without_message_id_is_refused_again(
    fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool,
) -> None:
    front = fleet.start("front")
    await fleet.ready(front)
    await asyncio.to_thread(rabbit.publish_without_message_id, "front", encode(Add("c", 1)),
                            "Add")

    async def dead_lettered() -> bool:
        return await rabbit.depth("front.dlq") == 1

    await until(dead_lettered, 20, "the dead letter", fleet, rabbit)
    [dead] = await rabbit.take("front.dlq", 1)
    assert (dead.headers or {}).get(REASON_HEADER) == "no message_id"
    replayed = {k: str(v) for k, v in (dead.headers or {}).items()
                if k not in (REASON_HEADER, ENDPOINT_HEADER, ATTEMPTS_HEADER)}
    await rabbit.publish("front", dead.body, dead.message_id, dead.type, replayed)

    async def settled() -> bool:
        return (await rabbit.depth("front.dlq") == 1 or await rabbit.depth("counter") > 0
                or bool(await pool.fetchval("SELECT count(*) FROM eo_processed_message")))

    await until(settled, 20, "the replay settled", fleet, rabbit)
    await asyncio.sleep(0.3)  # a relay to counter would follow the commit at once
    assert await pool.fetchval("SELECT count(*) FROM eo_processed_message") == 0
    assert await rabbit.depth("counter") == 0
    [again] = await rabbit.take("front.dlq", 1)
    assert (again.headers or {}).get(REASON_HEADER) == "no message_id"


# ---------------------------------------------------------------------------------------------
# graceful shutdown


async def test_sigterm_stops_gracefully_and_loses_nothing(
    fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool,
) -> None:
    counters, per_counter = 40, 10
    await topology.declare(rabbit, "counter", DELAYS, DELIVERY_LIMIT)
    sent = {(f"k{k:02}", 2 ** i): token_envelope(Add(f"k{k:02}", 2 ** i))
            for i in range(per_counter) for k in range(counters)}
    n = len(sent)
    tokens = PostgresTokenStore(pool)
    await publish_with_tokens(rabbit, tokens, "counter", list(sent.values()))
    # each handler run lasts 200 ms, so deliveries are in flight whenever SIGTERM comes, on a
    # loaded machine too (without it, a descheduled consumer could have none at that moment)
    counter = fleet.start("counter", EO_FAILPOINTS="after_handler=sleep:200")
    await fleet.ready(counter)

    async def under_way() -> bool:
        return await tokens.count() <= n - 40

    await until(under_way, 20, "processing under way", fleet)
    signalled = datetime.now(UTC)
    counter.popen.send_signal(signal.SIGTERM)
    stopping = time.monotonic()
    # the wait bounds a hang only: that the stop took no new delivery (did not drain the
    # queue) is what `left` and the counts below say, whatever the machine's load
    code = await fleet.exit_code(counter, 60)
    took = time.monotonic() - stopping
    assert code == 0, f"exit {code} after {took:.1f} s\n{counter.tail()}"

    left = {row["message_id"] for row in await pool.fetch("SELECT message_id FROM eo_token")}
    assert left, "everything was processed before SIGTERM: nothing was in flight"
    done = {key: e for key, e in sent.items() if e.message_id not in left}
    # each message is applied once (its token gone) or waits in the queue (its token kept)
    expected: dict[str, int] = defaultdict(int)
    for name, amount in done:
        expected[name] += amount
    tallies = await states(pool, "counter", Tally)
    assert {k: t.total for k, t in tallies.items() if t.total} == dict(expected)
    applied = [m for t in tallies.values() for m in t.applied]
    assert sorted(applied) == sorted(str(e.message_id) for e in done.values())
    assert await rabbit.depths("counter") == {
        "counter": len(left), "counter.retry.50ms": 0, "counter.retry.100ms": 0, "counter.dlq": 0}
    assert await unfinished(pool) == 0
    [stopped] = counter.events("consumer.stopped")
    assert stopped.get("processed") == len(done), stopped
    # deliveries were in flight at SIGTERM, and they were finished, not dropped
    assert any(logged_at(e) > signalled for e in counter.events("token.consumed"))
    assert len(counter.events("message.received")) == len(done)
    assert not any(stopped.get(k) for k in ("dead_lettered", "retried", "unsettled")), stopped

    again = fleet.start("counter")

    async def drained() -> bool:
        return await tokens.count() == 0 and await rabbit.depth("counter") == 0

    await until(drained, 30, "the rest processed after a restart", fleet, rabbit)
    tallies = await states(pool, "counter", Tally)
    assert {t.total for t in tallies.values()} == {2 ** per_counter - 1}
    assert len(tallies) == counters
    assert sum(len(t.applied) for t in tallies.values()) == n
    assert await unfinished(pool) == 0
    again.popen.send_signal(signal.SIGTERM)
    assert await fleet.exit_code(again, 10) == 0, again.tail()


# ---------------------------------------------------------------------------------------------
# kill -9 and restart

ADDS, SPENDS = (1, 2, 4, 8, 16, 32), (64, 128, 256)
BALANCE = 64 + 256  # some spends debited, some refused, depending on their order


async def test_counter_killed_mid_run_and_restarted_settles_every_command_once(
    fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool,
) -> None:
    names = [f"k{k:02}" for k in range(16)]
    accounts = names[::2]  # the others have no account at the bank: every spend refused
    for name in accounts:
        await pool.execute("INSERT INTO eo_transaction_record (endpoint, partition_key, state) "
                           "VALUES ('bank', $1, $2)", name, to_jsonable(Account(BALANCE)))
    commands: list[Add | Spend] = [
        *(Add(name, a) for name in names for a in ADDS),
        *(Spend(name, s) for name in names for s in SPENDS)]
    random.Random(11).shuffle(commands)  # the producer's order is not the business order

    bank = fleet.serve("bank", BANK_TOKEN)
    await fleet.ready(bank)
    assert bank.url is not None
    over_http = calling("bank", bank.url, BANK_TOKEN)
    front, audit = fleet.start("front"), fleet.start("audit")
    # the first counter process dawdles after each commit, so the kill likely finds a
    # committed, unfinished transaction
    counter = fleet.start("counter", EO_FAILPOINTS="after_commit=sleep:20", **over_http)
    await fleet.ready(front, audit, counter)
    await asyncio.gather(*(rabbit.publish("front", encode(c), natural_id(c), type(c).__name__)
                           for c in commands))

    async def answered() -> int:
        return sum(len(t.spent) + len(t.refused)
                   for t in (await states(pool, "counter", Tally)).values())

    async def spending() -> bool:  # the bank's answers are being recorded
        return await answered() >= 3

    await until(spending, 30, "some spends answered", fleet, rabbit)
    counter.popen.kill()
    assert await fleet.exit_code(counter, 5) == -signal.SIGKILL
    assert await answered() < len(names) * len(SPENDS), "killed after the work was done"
    restarted = fleet.start("counter", **over_http)

    async def quiescent() -> bool:
        logs = await states(pool, "audit", AuditLog)
        if sum(len(log.reports) for log in logs.values()) < len(names) * len(SPENDS):
            return False
        queues = [await rabbit.depths(e) for e in CONSUMING]
        return (await pool.fetchval("SELECT count(*) FROM eo_token") == 0
                and await unfinished(pool) == 0
                and await pool.fetchval("SELECT count(*) FROM eo_http_request") == 0
                and not any(sum(q.values()) for q in queues))

    await until(quiescent, 60, "quiescence after the restart", fleet, rabbit)
    for proc in (front, restarted, audit, bank):
        assert proc.alive(), fleet.tails()

    tallies = await states(pool, "counter", Tally)
    logs = await states(pool, "audit", AuditLog)
    balances = await states(pool, "bank", Account)
    assert set(tallies) == set(logs) == set(names)
    assert set(balances) == set(accounts)
    for name in names:
        tally = tallies[name]
        assert tally.total == sum(ADDS), name  # every Add once: a doubled one shows
        # an Add, a Spend and a Spent per command, each message applied once
        assert len(set(tally.applied)) == len(tally.applied) == len(ADDS) + 2 * len(SPENDS)
        assert sorted(tally.spent + tally.refused) == sorted(SPENDS), name
        account = balances.get(name)
        debits = account.debits if account is not None else ()
        assert sorted(debits) == sorted(tally.spent), name  # the bank and the counter agree
        if account is not None:
            assert account.balance == BALANCE - sum(debits) >= 0, name
        reports = sorted((r.amount, r.status) for r in logs[name].reports)
        assert reports == sorted([(a, 200) for a in tally.spent]
                                 + [(a, 409) for a in tally.refused]), name
    # one receipt per Add and Spend, and no blob of a lost attempt
    receipts = {key for t in tallies.values() for key in t.receipts}
    assert len(receipts) == len(names) * (len(ADDS) + len(SPENDS))
    assert set(await LocalDirectoryBlobStore(fleet.blob_dir).keys()) == receipts
    assert await pool.fetchval("SELECT count(*) FROM eo_token") == 0
    assert await unfinished(pool) == 0
    for endpoint in CONSUMING:
        assert await rabbit.depth(f"{endpoint}.dlq") == 0, endpoint


# ---------------------------------------------------------------------------------------------
# two consumers of one endpoint on one host, with default settings


async def test_a_slow_stop_says_what_it_waits_for_and_ends_gracefully(
    fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool,
) -> None:
    """SIGTERM while a handler runs 12 s (a failpoint): after 10 s the consumer logs
    `consumer.stopping` with where its tasks wait (the failpoint's sleep among them), then
    finishes the delivery and exits 0 (a chaos campaign saw a stop outlast 30 s, and had
    nothing to tell why)."""
    await topology.declare(rabbit, "counter", DELAYS, DELIVERY_LIMIT)
    tokens = PostgresTokenStore(pool)
    await publish_with_tokens(rabbit, tokens, "counter", [token_envelope(Add("slow", 1))])
    counter = fleet.start("counter", EO_FAILPOINTS="after_handler=sleep:12000@1")
    await fleet.ready(counter)

    async def in_handler() -> bool:
        return bool(counter.events("fault.injected"))

    await until(in_handler, 20, "the handler's sleep", fleet)
    counter.popen.send_signal(signal.SIGTERM)
    code = await fleet.exit_code(counter, 30)
    assert code == 0, f"exit {code}\n{counter.tail()}"
    [report] = counter.events("consumer.stopping")[:1]
    assert report["waited_s"] >= 10
    assert any("Failpoints.hit" in t for t in report["tasks"]), report["tasks"]
    assert await tokens.count() == 0  # the delivery in flight was finished, not dropped


async def test_two_consumers_on_one_host_pick_their_own_status_ports_and_share_the_work(
    fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool,
) -> None:
    first, second = fleet.start("counter"), fleet.start("counter")  # no EO_METRICS_PORT
    await fleet.ready(first, second)
    assert first.url is not None
    assert second.url is not None
    assert first.url != second.url, (first.url, second.url)
    for proc in (first, second):
        status, body = await asyncio.to_thread(proc.get, "/ready")
        assert (status, json.loads(body)["consuming"]) == (200, True), proc.name
        [started] = proc.events("consumer.started")  # its start line says what it runs
        assert started["template_version"] == TEMPLATE_VERSION, started
        assert started["service_version"] == service_version() != "unknown", started

    async def both_consume() -> bool:
        return await rabbit.consumers("counter") == 2

    await until(both_consume, 10, "two consumers on the counter queue", fleet)
    sent = [token_envelope(Add(f"k{k}", 2 ** i)) for i in range(8) for k in range(8)]
    tokens = PostgresTokenStore(pool)
    await publish_with_tokens(rabbit, tokens, "counter", sent)

    async def drained() -> bool:
        return await tokens.count() == 0 and await rabbit.depth("counter") == 0

    await until(drained, 30, "every message processed", fleet, rabbit)
    tallies = await states(pool, "counter", Tally)
    assert {k: t.total for k, t in tallies.items()} == {f"k{k}": 2 ** 8 - 1 for k in range(8)}
    committed = [len(p.events("transaction.committed")) for p in (first, second)]
    assert sum(committed) == len(sent)  # each message committed once, by one of them
    assert all(committed), committed  # the broker gave both a share
    for proc in (first, second):
        proc.popen.send_signal(signal.SIGTERM)
    for proc in (first, second):
        assert await fleet.exit_code(proc, 10) == 0, proc.tail()


# ---------------------------------------------------------------------------------------------
# eo migrate and eo inspect


async def _tables(dsn: str) -> tuple[set[str], str]:
    conn = await asyncpg.connect(dsn)
    try:
        names = {r["tablename"] for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        return names, await conn.fetchval("SELECT version_num FROM eo_schema_version")
    finally:
        await conn.close()


async def _seed_for_inspect(dsn: str) -> None:
    """A token in flight, one a dead letter keeps, an unfinished transaction record, and two
    deferred clean-ups: one whose artifact (a token) is still there, one whose is gone."""
    conn = await asyncpg.connect(dsn)
    in_flight, kept, gone = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    try:
        for token in (in_flight, kept):
            await conn.execute("INSERT INTO eo_token (endpoint, message_id, type, body) "
                               "VALUES ('audit', $1, 'x', '')", token)
        await conn.execute(
            "INSERT INTO eo_transaction_record (endpoint, partition_key, message_id, "
            "attempt_id, committed_at) VALUES ('audit', '1', $1, $2, now())",
            uuid.uuid4(), uuid.uuid4())
        await conn.execute(
            "INSERT INTO eo_dead_letter (endpoint, message_id, body, replayable, reasons, "
            "first_at, last_at) VALUES ('audit', $1, '', true, "
            "'[{\"at\": \"2026-01-01T00:00:00+00:00\", \"reason\": \"r\", "
            "\"attempt\": 1}]', now(), now())", kept)
        for token in (in_flight, gone):
            await conn.execute(
                "INSERT INTO eo_deferred_cleanup (endpoint, kind, key, payload, due) "
                "VALUES ('counter', 'message', $1, '{\"destination\": \"audit\"}', now())",
                str(token))
    finally:
        await conn.close()


def test_migrate_creates_the_database_once_and_inspect_reports(where: Where) -> None:
    name = f"eo_it_migrate_{uuid.uuid4().hex[:12]}"
    dsn = with_database(where.dsn, name)
    env = {"EO_SERVICE": SPEC, "EO_PROFILE": "local", "EO_DATABASE_DSN": dsn,
           "EO_AMQP_URL": where.amqp_url, "EO_RETRY_DELAYS_S": json.dumps(list(DELAYS)),
           "EO_TOKEN_DSN": None, "EO_FAILPOINTS": None, "EO_STRATEGIES": None}
    runner = CliRunner()
    try:
        first = runner.invoke(app, ["migrate"], env=env)
        assert first.exit_code == 0, first.output
        assert f"created database {name}" in first.output
        head = head_revision()
        assert f"database {name}: empty -> {head}, {int(head)} revisions applied:\n  0001 " \
            in first.output
        tables, version = asyncio.run(_tables(dsn))
        assert set(TABLES) | {"eo_schema_version"} <= tables
        assert version == head_revision()

        asyncio.run(_seed_for_inspect(dsn))
        second = runner.invoke(app, ["migrate"], env=env)
        assert second.exit_code == 0, second.output
        assert "created database" not in second.output
        assert f"database {name}: at {head}, up to date" in second.output
        assert asyncio.run(_tables(dsn)) == (tables, version)

        shown = runner.invoke(app, ["inspect"], env=env)
        assert shown.exit_code == 0, shown.output
        # the rows seeded survived the re-run; the dead letter's token is counted apart
        assert "tokens in flight: 1; kept by dead letters: 1" in shown.output
        cells = [[cell.strip() for cell in line.strip().strip("│").split("│")]
                 for line in shown.output.splitlines() if line.startswith("│")]
        rows = {row[0]: row[1:] for row in cells if row[0] in (*CONSUMING, "bank")}
        assert set(rows) == {*CONSUMING, "bank"}, shown.output
        assert rows["audit"][0] == "1", shown.output  # one unfinished transaction record
        assert rows["front"][0] == rows["counter"][0] == rows["bank"][0] == "0", shown.output
        assert rows["counter"][2] == "2 (1 gone)", shown.output
        assert rows["bank"][-2] == "-", shown.output  # a callee has no dead-letter queue
        assert rows["audit"][-1] == "1 dead", shown.output
    finally:
        asyncio.run(drop_database(dsn))


def test_migrate_says_which_revisions_it_applied_from_which_to_which(where: Where) -> None:
    """An upgrade of a service's database from an older release: an operator must see what
    changed ("schema is up to date" alone hid four revisions applied)."""
    name = f"eo_it_migrate_{uuid.uuid4().hex[:12]}"
    dsn = with_database(where.dsn, name)
    env = {"EO_SERVICE": SPEC, "EO_PROFILE": "local", "EO_DATABASE_DSN": dsn,
           "EO_AMQP_URL": where.amqp_url, "EO_TOKEN_DSN": None}
    try:
        asyncio.run(ensure_database(dsn))
        upgrade(dsn, "0009")  # the schema of an older release
        done = CliRunner().invoke(app, ["migrate"], env=env)
        assert done.exit_code == 0, done.output
        head = head_revision()
        later = [f"{n:04d}" for n in range(10, int(head) + 1)]
        lines = done.output.splitlines()
        assert f"database {name}: 0009 -> {head}, {len(later)} revisions applied:" in lines
        assert [line.split()[0] for line in lines if line.startswith("  ")] == later
    finally:
        asyncio.run(drop_database(dsn))
