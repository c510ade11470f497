"""Dead letters an operator acts on, with real `eo consume` processes of the counters service on
PostgreSQL and RabbitMQ and the `eo dead-letters` command (issue 24): the consumers move their
dead-letter queues into the store, a replay after the cause is fixed is processed once, a
replay of a processed message is dropped as a duplicate, a discard leaves nothing at rest, and
a full dead-letter queue loses nothing: the consumer holds the dead letter, takes no new
delivery, says so (/ready, a metric, an ERROR log) and goes on once there is room.

The consumers and `eo dead-letters serve` are real processes; of the operator's commands, the
first use of each (`list`, `replay`, `discard`, `show`, and `eo inspect`) is one too (`eo`:
the console entry point), the others run in this process (`here`:
tests/support/in_process.py) with the same environment.

A database and a virtual host of this module's own (tests/support/processes.py)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import asyncpg
import pytest

from adapters.postgres.admin import with_database
from adapters.postgres.token_store import PostgresTokenStore
from application.codec import encode
from application.envelope import TOKEN_HEADER, Envelope
from tests.support.counters.endpoints import Add, Tally
from tests.support.counters.registry import SPEC
from tests.support.in_process import eo_in_thread
from tests.support.processes import (
    ROOT,
    Fleet,
    Rabbit,
    Where,
    eo_command,
    fresh_fleet,
    metric,
    states,
    until,
    where_for,
)

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

DATABASE = "eo_it_dead_letters"
VHOST = "eo-it-dead-letters"


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with where_for(DATABASE, VHOST) as found:
        yield found


@pytest.fixture
async def fleet(where: Where, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with fresh_fleet(where, tmp_path) as started:
        conn = await asyncpg.connect(where.dsn)
        try:
            await conn.execute("TRUNCATE eo_dead_letter")
        finally:
            await conn.close()
        yield started


def _message(counter: str, amount: int) -> Envelope:
    return Envelope(uuid.uuid4(), "Add", encode(Add(counter, amount)),
                    MappingProxyType({TOKEN_HEADER: "1"}))


async def _send(rabbit: Rabbit, tokens: PostgresTokenStore, *envelopes: Envelope,
                token: bool = True) -> None:
    if token:
        await tokens.create("counter", list(envelopes))
    for e in envelopes:
        await rabbit.publish("counter", e.body, str(e.message_id), e.type, dict(e.headers))


def eo(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    """`eo <args>` as an operator runs it, a process of the console script, on the fleet's
    database and broker."""
    return subprocess.run([*eo_command(), *args], cwd=ROOT, env=fleet.env(), text=True,
                          capture_output=True, timeout=60)


async def here(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    """What `eo(fleet, *args)` gives, run in this process (tests/support/in_process.py)
    with the environment `eo` gives its process: no cold interpreter to start."""
    return await eo_in_thread(fleet.env(), *args)


async def _listed(fleet: Fleet, *filters: str) -> list[dict[str, object]]:
    done = await here(fleet, "dead-letters", "list", "--format", "json", *filters)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


async def test_replay_after_a_fix_a_replay_of_a_processed_message_and_a_discard(
    fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool,
) -> None:
    tokens = PostgresTokenStore(pool)
    broken = fleet.start("counter", EO_DEAD_LETTER_COLLECT="true", EO_MAX_ATTEMPTS="1",
                         EO_FAILPOINTS="after_handler=raise")  # the cause, fixed below
    await fleet.ready(broken)
    fixed_later, processed_meanwhile, given_up = (_message(f"d{i}", 2 ** i) for i in range(3))
    await _send(rabbit, tokens, fixed_later, processed_meanwhile, given_up)

    async def kept() -> bool:
        return await pool.fetchval("SELECT count(*) FROM eo_dead_letter") == 3

    await until(kept, 30, "3 dead letters moved into the store", fleet, rabbit)
    shown = eo(fleet, "dead-letters", "list")
    assert shown.returncode == 0, shown.stderr
    assert "3 dead letters" in shown.stdout
    listed = {str(d["message_id"]): d for d in await _listed(fleet)}
    assert set(listed) == {str(e.message_id) for e in (fixed_later, processed_meanwhile,
                                                        given_up)}
    for letter in listed.values():
        reasons = letter["reasons"]
        assert isinstance(reasons, list)
        assert reasons[0]["reason"].startswith("retries exhausted after 1 attempts")
        assert letter["status"] == "dead"
        assert letter["token_exists"] is None  # a list shows no token: `show` does
    assert await tokens.count() == 3  # dead letters keep their tokens

    async def gauged() -> bool:  # the tokens dead letters keep, apart from those in flight
        scrape = (await asyncio.to_thread(broken.get, "/metrics"))[1]
        return ("eo_dead_letter_tokens 3.0" in scrape
                and "eo_tokens_in_flight 0.0" in scrape
                and 'eo_dead_letters{endpoint="counter",status="dead"} 3.0' in scrape)

    await until(gauged, 20, "the dead letters' gauges", fleet, rabbit)

    # the fix: the consumer without the failure
    broken.popen.terminate()
    assert await fleet.exit_code(broken, 20) == 0, broken.tail()
    healthy = fleet.start("counter", EO_DEAD_LETTER_COLLECT="true")
    await fleet.ready(healthy)

    def id_of(envelope: Envelope) -> str:
        return str(listed[str(envelope.message_id)]["dead_letter_id"])

    replayed = eo(fleet, "dead-letters", "replay", id_of(fixed_later), "--by", "alice")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "done" in replayed.stdout

    async def applied(counter: str, total: int) -> bool:
        found = (await states(pool, "counter", Tally)).get(counter)
        return found is not None and found.total == total

    await until(lambda: applied("d0", 1), 20, "the replay processed", fleet, rabbit)

    await _send(rabbit, tokens, processed_meanwhile, token=False)  # another copy, after the fix
    await until(lambda: applied("d1", 2), 20, "the copy processed", fleet, rabbit)
    again = await here(fleet, "dead-letters", "replay", id_of(processed_meanwhile), "--by",
                       "bob")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "its token is gone" in again.stdout

    discarded = eo(fleet, "dead-letters", "discard", id_of(given_up), "--why", "cancelled")
    assert discarded.returncode == 0, discarded.stdout + discarded.stderr
    refused = await here(fleet, "dead-letters", "replay", id_of(given_up))
    assert refused.returncode == 1
    assert "discarded already" in refused.stdout

    async def quiet() -> bool:
        scrape = (await asyncio.to_thread(healthy.get, "/metrics"))[1]
        return metric(scrape, "counter", "message.duplicate") >= 1
    await until(quiet, 20, "the second replay dropped as a duplicate", fleet, rabbit)
    totals = {k: v.total for k, v in (await states(pool, "counter", Tally)).items()}
    assert totals == {"d0": 1, "d1": 2}  # each once; the discarded one never
    assert await tokens.count() == 0  # nothing at rest
    assert await pool.fetchval("SELECT count(*) FROM eo_side_effect_record") == 0
    statuses = {str(d["message_id"]): d["status"]
                for d in await _listed(fleet, "--status", "any")}
    assert sorted(statuses.values()) == ["discarded", "replayed", "replayed"]
    (gone,) = [d for d in await _listed(fleet, "--status", "discarded")]
    assert gone["discard_reason"] == "cancelled"
    assert str(gone["acted_by"]).count("@") == 1  # <user>@<host> by default
    shown = eo(fleet, "dead-letters", "show", id_of(given_up))
    assert "discarded by" in shown.stdout
    assert "cancelled" in shown.stdout
    inspected = eo(fleet, "inspect")
    assert inspected.returncode == 0, inspected.stderr
    assert "tokens in flight: 0" in inspected.stdout


async def test_a_full_dead_letter_queue_pauses_the_consumer_and_loses_nothing(
    fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool,
) -> None:
    """200 bodies of 900 KB became 194 messages and 174.6 MB cycling through a retry queue
    (issue 24). Now: held, paused, said, and on again once there is room."""
    tokens = PostgresTokenStore(pool)
    counter = fleet.start("counter", EO_DEAD_LETTER_MAX_BYTES="600")  # a new, small bound
    await fleet.ready(counter)
    refused = [_message("r" * 200 + str(i), -1) for i in range(5)]  # rejected: negative
    # a quorum queue checks its bound as it enqueues: copies published at once may pass it
    # together, so the queue is filled first, then the others meet it
    await _send(rabbit, tokens, *refused[:3])

    async def filled() -> bool:
        return await rabbit.depth("counter.dlq") == 3

    await until(filled, 30, "the dead-letter queue past its bound", fleet, rabbit)
    await _send(rabbit, tokens, *refused[3:])

    async def blocked() -> bool:
        status, body = await asyncio.to_thread(counter.get, "/ready")
        return status == 503 and json.loads(body).get("dead_letter_queue") is False

    await until(blocked, 30, "the consumer paused on the full dead-letter queue", fleet, rabbit)
    good = _message("g", 8)
    await _send(rabbit, tokens, good)
    await asyncio.sleep(2)
    assert await tokens.exists("counter", good.message_id)  # not taken meanwhile
    scrape = (await asyncio.to_thread(counter.get, "/metrics"))[1]
    assert 'eo_dead_letter_queue_full{endpoint="counter"} 1.0' in scrape
    (full,) = counter.events("dead_letter_queue.full")
    assert full["level"] == "error"
    waiting = await rabbit.depth("counter.dlq")
    assert waiting < len(refused)
    taken = await rabbit.take("counter.dlq", len(refused))  # an operator makes room

    async def on_again() -> bool:
        return (not await tokens.exists("counter", good.message_id)
                and await rabbit.depth("counter.dlq") + len(taken) == len(refused))

    await until(on_again, 30, "every dead letter in and the valid message processed", fleet,
                rabbit)
    assert [await rabbit.depth(q) for q in ("counter.retry.50ms", "counter.retry.100ms")] == [0, 0]
    status, _ = await asyncio.to_thread(counter.get, "/ready")
    assert status == 200
    assert counter.events("dead_letter_queue.room")
    counter.popen.terminate()
    assert await fleet.exit_code(counter, 20) == 0, counter.tail()
    [stopped] = counter.events("consumer.stopped")
    assert (stopped["dead_lettered"], stopped["processed"], stopped["retried"]) == (5, 1, 0)


async def test_the_http_api_needs_an_operators_token_and_acts_in_its_name(
    fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool,
) -> None:
    tokens = PostgresTokenStore(pool)
    counter = fleet.start("counter", EO_DEAD_LETTER_COLLECT="true")
    api = fleet.spawn("dead-letters", ["dead-letters", "serve"],
                      {"EO_OPERATOR_TOKENS": json.dumps({"alice": "alice-token-0123456789"}),
                       "EO_OPERATOR_PORT": "0"},
                      url=("dead_letters.serving", "url"), ready_path="/openapi.json",
                      ready_headers={"Authorization": "Bearer alice-token-0123456789"})
    await fleet.ready(counter, api)
    negative = _message("n", -2)  # rejected by the handler
    await _send(rabbit, tokens, negative)

    async def kept() -> bool:
        return await pool.fetchval("SELECT count(*) FROM eo_dead_letter") == 1

    await until(kept, 30, "the dead letter moved into the store", fleet, rabbit)
    base = api.url
    assert base is not None

    def call(method: str, path: str, token: str | None = "alice-token-0123456789",
             body: object = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            base + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json",
                     **({"Authorization": f"Bearer {token}"} if token else {})})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    assert (await asyncio.to_thread(call, "GET", "/dead-letters", None))[0] == 401
    assert (await asyncio.to_thread(call, "GET", "/dead-letters", "wrong"))[0] == 401
    status, listed = await asyncio.to_thread(call, "GET", "/dead-letters?endpoint=counter")
    assert status == 200
    (letter,) = listed
    assert letter["reasons"][0]["reason"] == "rejected by handler: negative amount -2"
    assert letter["body"] == {"counter": "n", "amount": -2}
    i = letter["dead_letter_id"]
    status, shown = await asyncio.to_thread(call, "GET", f"/dead-letters/{i}")
    assert (status, shown["token_exists"]) == (200, True)
    status, answer = await asyncio.to_thread(call, "POST", f"/dead-letters/{i}/discard", body={})
    assert status == 422  # a discard says why
    status, answer = await asyncio.to_thread(call, "POST", "/dead-letters/discard",
                                             body={"why": "all of them"})
    assert status == 400
    assert answer["error"].startswith("a bulk action needs")
    status, answer = await asyncio.to_thread(call, "POST", f"/dead-letters/{i}/discard",
                                             body={"why": "a test order"})
    assert status == 200, answer
    assert answer["done"]
    status, answer = await asyncio.to_thread(call, "POST", f"/dead-letters/{i}/replay")
    assert status == 409
    assert not answer["done"]
    assert not await tokens.exists("counter", negative.message_id)
    (discarded,) = api.events("dead_letter.discarded")
    assert (discarded["by"], discarded["why"]) == ("alice", "a test order")


async def test_listing_the_dead_letters_needs_the_database_alone(where: Where) -> None:
    """`eo dead-letters list` reads one table: it opens one pool and no broker connection
    (issue 40), so it answers while RabbitMQ is away (here: an AMQP URL where nothing
    listens, which a command connecting to the broker would wait for, then fail on)."""
    with socket.socket() as probe:  # a free port, closed again: nothing listens there
        probe.bind(("127.0.0.1", 0))
        nowhere = probe.getsockname()[1]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EO_")},
           "EO_PROFILE": "local", "EO_SERVICE": SPEC, "EO_DATABASE_DSN": where.dsn,
           "EO_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{nowhere}/", "EO_BROKER_GIVE_UP_S": "5"}
    done = await eo_in_thread(env, "dead-letters", "list", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout), list)


@pytest.mark.parametrize("command", [("list",), ("show", "1")])
async def test_a_missing_database_is_named_with_what_to_do_not_a_traceback(
        where: Where, command: tuple[str, ...]) -> None:
    """A dead-letter command against a database that does not exist (a fresh machine, a
    typo in EO_DATABASE_DSN) exits 3 saying so and what to do, as start-up does; it printed
    asyncpg's traceback before."""
    missing = f"eo_missing_{uuid.uuid4().hex[:12]}"  # never created: nothing to remove
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EO_")},
           "EO_PROFILE": "local", "EO_SERVICE": SPEC,
           "EO_DATABASE_DSN": with_database(where.dsn, missing), "EO_AMQP_URL": where.amqp_url,
           "EO_BROKER_GIVE_UP_S": "5"}
    done = await eo_in_thread(env, "dead-letters", *command)
    said = " ".join(done.stderr.split())  # the console wraps it to its width
    assert done.returncode == 3, done.stderr
    assert f"database '{missing}' does not exist: run `eo migrate`" in said
    assert "Traceback" not in said
