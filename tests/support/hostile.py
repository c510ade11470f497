"""A hostile producer at a gateway, on the real broker and PostgreSQL (issue 37): random bytes
in the type, the message ID, header names and values, the content type and the body,
legitimate commands among them, then what must hold at quiescence (`run`).

What is sent is drawn by hypothesis at a fixed seed (`plan`: the same deliveries on every
run of one hypothesis version, generate phase only, no shrinking: each delivery is
independent, and a failure names the ones that went wrong with everything that was sent).
Each hostile delivery is made invalid on purpose in at least one of the places the service
reads (its type, message ID, body, or a kept protocol header holding bytes that are not
clean text); every delivery, hostile or not, also carries random bytes where the service
reads nothing (the content type, headers it does not keep, their names too). Some are sent
twice under one message ID. Every delivery carries the test's own kept header (`SEQ_HEADER`),
so its dead letter is found in the store whatever its message ID.

What must hold (`run`): the processes never lose a consumer (no channel storm) and never
restart; every legitimate command is processed once (`Target.processed`); every hostile
message is one entry of the dead-letter store, at the gateway, with a reason per copy (one
dead letter per message, whatever its copies); nothing else is in the store; every queue of
the gateway and its downstream endpoint is empty.

`python -m tests.support.hostile --target sample --deliveries 10000 --commands 1000` runs a
long campaign on the sample outside pytest and prints its counts and time (the figures in
the notes of issue 37); the suite runs a short one on the counters service
(tests/integration/test_hostile_producer.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import asyncpg
import pika
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from adapters.postgres.pool import create_pool
from application.codec import encode
from application.wire_text import clean
from tests.support.processes import (
    Fleet,
    Proc,
    Where,
    fresh_fleet,
    publisher,
    states,
    where_for,
)

SEED = int(os.environ.get("EO_TEST_HOSTILE_SEED", "20261127"))
#: the test's own header on every delivery (kept: EO_KEPT_HEADERS), the same on both copies
#: of a message sent twice
SEQ_HEADER = "hostile-seq"
#: protocol headers a hostile delivery sets to what is not clean text (each is kept)
KEPT_PROTOCOL = ("eo-attempts", "eo-origin-id", "eo-causation-id", "eo-token",
                 "eo-retry-reason")
#: the places a hostile delivery is made invalid in (at least one each)
FAULTS = ("type", "message_id", "body", "kept_header")


@dataclass(frozen=True)
class Target:
    """A service's gateway and the endpoint it relays to: `legit(i)` is the i-th legitimate
    command (its type, a frozen dataclass message, its partition's key), `processed` what
    the downstream endpoint's state must be once each was processed once."""

    name: str
    service: str
    gateway: str
    downstream: str
    types: tuple[str, ...]
    legit: Callable[[int], tuple[str, Any]]
    state_type: type
    processed: Callable[[Any], tuple[str, Callable[[Any], bool]]]


def _counters() -> Target:
    from tests.support.counters.endpoints import Add, Tally
    from tests.support.counters.registry import SPEC

    def legit(i: int) -> tuple[str, Any]:
        return "Add", Add(f"hostile-{i}", 1)

    def processed(message: Any) -> tuple[str, Callable[[Any], bool]]:
        return message.counter, lambda tally: tally.total == 1 and len(tally.applied) == 1

    return Target("counters", SPEC, "front", "counter", ("Add", "Spend"), legit, Tally,
                  processed)


def _sample() -> Target:
    from datetime import date

    from domain.sample.messages import PlaceOrder
    from domain.sample.orders import Order
    from entrypoints.settings import DEFAULT_SERVICE

    base = 8_000_000

    def legit(i: int) -> tuple[str, Any]:
        return "PlaceOrder", PlaceOrder(base + i, 1 + i % 1000, date(1996, 1, 2), "1-URGENT", 3)

    def processed(message: Any) -> tuple[str, Callable[[Any], bool]]:
        return str(message.order_key), lambda order: order.customer_key == message.customer_key

    return Target("sample", DEFAULT_SERVICE, "gateway", "orders",
                  ("PlaceOrder", "AddItem", "RemoveItem", "SubmitOrder"), legit, Order,
                  processed)


TARGETS: dict[str, Callable[[], Target]] = {"counters": _counters, "sample": _sample}


@dataclass(frozen=True)
class Delivery:
    """One message as published, with pika's properties as bytes (any octets): `seq` its
    number, `copies` how often it is sent (the same bytes), `faults` where it was made
    invalid (empty: a legitimate command, `message` its decoded form)."""

    seq: int
    message_id: bytes | None
    type: bytes | None
    body: bytes
    headers: dict[bytes, Any]
    content_type: bytes | None
    copies: int = 1
    faults: tuple[str, ...] = ()
    message: Any = None

    def properties(self) -> pika.BasicProperties:
        return pika.BasicProperties(
            delivery_mode=2, message_id=self.message_id, type=self.type,
            content_type=self.content_type,
            headers={**self.headers, SEQ_HEADER.encode(): str(self.seq)})


_BYTES = st.binary(max_size=40)
#: what is never clean text: U+0000 or bytes that are not UTF-8 whatever surrounds them (a
#: byte no UTF-8 holds, a lead byte before a byte that cannot follow it, an encoded
#: surrogate), somewhere in random bytes
_UNCLEAN = st.tuples(_BYTES, st.sampled_from([b"\x00", b"\xff", b"\xc0", b"\xc3(",
                                              b"\xed\xa0\x80"]), _BYTES).map(b"".join)
_VALUES = st.one_of(st.binary(max_size=30), st.text(max_size=20),
                    st.integers(-(2**31), 2**31 - 1))
#: headers the service does not keep: any bytes in their names and values
_IGNORED = st.dictionaries(
    st.binary(min_size=1, max_size=30).filter(
        lambda k: not k.startswith((b"eo-", SEQ_HEADER.encode()))), _VALUES, max_size=3)


def _is_uuid(raw: bytes) -> bool:
    try:
        uuid.UUID(raw.decode("utf-8"))
    except ValueError:
        return False
    return True


def _valid_json(body: bytes) -> bool:
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


@st.composite
def hostile(draw: st.DrawFn, target: Target) -> Delivery:
    """A delivery invalid in at least one place the service reads (`FAULTS`)."""
    faults = tuple(sorted(draw(st.sets(st.sampled_from(FAULTS), min_size=1, max_size=3))))
    type_ = draw(st.sampled_from(target.types)).encode()
    if "type" in faults:
        type_ = draw(st.one_of(_BYTES, _UNCLEAN).filter(
            lambda t: t.decode("utf-8", "replace") not in target.types))
    message_id: bytes | None = b""  # `plan` makes it a UUID of its own
    if "message_id" in faults:  # `plan` appends the delivery's number to these
        message_id = draw(st.one_of(st.none(), _BYTES, _UNCLEAN))
    _, example = target.legit(0)
    body = encode(example)
    if "body" in faults:
        body = draw(st.one_of(st.binary(max_size=200), st.just(body[:-1]),
                              _UNCLEAN.map(lambda b: b'{"' + b + b'": 1}')))
        if _valid_json(body):  # valid JSON of the wrong shape is what is wanted; not a
            body = b"[" + body  # valid message by accident
    headers: dict[bytes, Any] = draw(_IGNORED)
    if "kept_header" in faults:
        name = draw(st.sampled_from(KEPT_PROTOCOL)).encode()
        headers[name] = draw(_UNCLEAN)
    content_type = draw(st.one_of(st.none(), _BYTES, _UNCLEAN))
    copies = draw(st.sampled_from([1, 1, 1, 2])) if message_id is not None else 1
    return Delivery(0, message_id, type_, body, headers, content_type, copies, faults)


@st.composite
def legitimate(draw: st.DrawFn) -> tuple[dict[bytes, Any], bytes | None, int]:
    """What a legitimate command carries where the service reads nothing, and its copies."""
    return (draw(_IGNORED), draw(st.one_of(st.none(), _BYTES, _UNCLEAN)),
            draw(st.sampled_from([1, 1, 1, 2])))


def _drawn(strategy: st.SearchStrategy[Any], examples: int, at_seed: int) -> list[Any]:
    found: list[Any] = []

    @seed(at_seed)
    @settings(max_examples=examples, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example: Any) -> None:
        found.append(example)

    while len(found) < examples:  # hypothesis may stop early on a small search space
        collect()
    return found[:examples]


def plan(target: Target, deliveries: int, commands: int, at_seed: int = SEED
         ) -> list[Delivery]:
    """`deliveries` hostile messages and `commands` legitimate ones (copies on top),
    shuffled together by the seed; numbered in that order."""
    drawn = _drawn(hostile(target), deliveries, at_seed)
    extras = _drawn(legitimate(), commands, at_seed + 1)
    for i, (headers, content_type, copies) in enumerate(extras):
        type_, message = target.legit(i)
        drawn.append(Delivery(0, b"", type_.encode(), encode(message), headers, content_type,
                              copies, (), message))
    order = list(range(len(drawn)))
    random.Random(at_seed).shuffle(order)  # hypothesis draws no permutation of thousands
    planned = [_numbered(drawn[i], n, at_seed) for n, i in enumerate(order)]
    for d in planned:  # each fault is one for sure: a lucky draw would be a valid message
        assert d.faults or d.message is not None, d
        for name in {n for n in d.headers if n.startswith(b"eo-")}:
            assert not clean(d.headers[name].decode("utf-8", "surrogateescape")), d
    return planned


def _numbered(delivery: Delivery, n: int, at_seed: int) -> Delivery:
    """`delivery` as the n-th: its message ID its own (two hostile messages under one ID
    with the same type and body are one message, rightly one dead letter), a UUID unless it
    is a fault, which stays one (never a UUID)."""
    message_id = delivery.message_id
    if message_id == b"" and "message_id" not in delivery.faults:
        message_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{at_seed}/{n}")).encode()
    elif message_id is not None:
        message_id = message_id + b"/" + str(n).encode()
    return replace(delivery, seq=n, message_id=message_id)


def publish(url: str, queue: str, deliveries: list[Delivery]) -> float:
    """Publish every copy (blocking; pika, publisher confirms, one connection); returns the
    seconds it took."""
    started = time.monotonic()
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for d in deliveries:
            for _ in range(d.copies):
                channel.basic_publish("", queue, d.body, d.properties())
    finally:
        connection.close()
    return time.monotonic() - started


@dataclass
class Seen:
    """What the store and the broker hold now."""

    entries: list[asyncpg.Record] = field(default_factory=list)
    states: dict[str, Any] = field(default_factory=dict)
    depths: dict[str, int] = field(default_factory=dict)


async def _seen(target: Target, where: Where, pool: asyncpg.Pool, rabbit: Any) -> Seen:
    entries = await pool.fetch(
        "SELECT endpoint, headers->>$1 AS seq, jsonb_array_length(reasons) AS times, "
        "reasons->-1->>'reason' AS reason, status FROM eo_dead_letter", SEQ_HEADER)
    depths = {}
    for endpoint in (target.gateway, target.downstream):
        depths.update(await rabbit.depths(endpoint))
    return Seen(list(entries), await states(pool, target.downstream, target.state_type), depths)


def _wrong(target: Target, sent: list[Delivery], seen: Seen) -> list[str]:
    """Each way `seen` is not what `sent` must end as (empty: all holds)."""
    wrong = []
    by_seq: dict[str, list[asyncpg.Record]] = {}
    for entry in seen.entries:
        by_seq.setdefault(str(entry["seq"]), []).append(entry)
    for d in sent:
        entries = by_seq.pop(str(d.seq), [])
        if d.faults:
            if len(entries) != 1 or entries[0]["times"] != d.copies or not entries[0]["reason"] \
                    or entries[0]["endpoint"] != target.gateway:
                wrong.append(f"hostile #{d.seq} {d}: entries {[dict(e) for e in entries]}")
        else:
            key, check = target.processed(d.message)
            state = seen.states.get(key)
            if entries or state is None or not check(state):
                wrong.append(f"command #{d.seq} {d.message}: state {state}, entries "
                             f"{[dict(e) for e in entries]}")
    wrong += [f"entries of no delivery: {[dict(e) for e in es]}" for es in by_seq.values()]
    wrong += [f"queue {q} holds {n}" for q, n in seen.depths.items() if n]
    return wrong


@dataclass(frozen=True)
class Report:
    """A campaign's figures."""

    hostile: int
    hostile_copies: int
    commands: int
    command_copies: int
    faults: Counter[str]
    publish_s: float
    settled_s: float
    lost: int

    def text(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))
        return (f"{self.hostile} hostile messages ({self.hostile_copies} deliveries; invalid "
                f"in: {faults}) among {self.commands} commands ({self.command_copies} "
                f"deliveries): published in {self.publish_s:.1f} s, all settled, stored and "
                f"checked {self.settled_s:.1f} s after the first publish; consumers lost: "
                f"{self.lost}")


def _lost(procs: list[Proc]) -> int:
    return sum(len(p.events("consumer.lost")) + len(p.events("consumer.restarted"))
               for p in procs)


async def run(target: Target, where: Where, tmp: Path, deliveries: int, commands: int,
              timeout_s: float) -> Report:
    """The campaign (see the module docstring); raises AssertionError naming what went
    wrong (at most 15 deliveries, then the processes' log tails)."""
    sent = plan(target, deliveries, commands)
    async with fresh_fleet(where, tmp, service=target.service,
                           endpoints=(target.gateway, target.downstream)) as fleet, \
            publisher(where) as rabbit:
        await _clear_store(where)
        procs = _start(fleet, target)
        await fleet.ready(*procs, timeout_s=90)
        started = time.monotonic()
        publish_s = await asyncio.to_thread(publish, where.amqp_url, target.gateway, sent)
        pool = await create_pool(where.dsn, max_size=2)
        try:
            wrong: list[str] = ["not looked at yet"]
            while wrong and time.monotonic() - started < timeout_s:
                await asyncio.sleep(0.5)
                if dead := [p.name for p in procs if not p.alive()]:
                    raise AssertionError(f"{dead} exited\n{fleet.tails()}")
                wrong = _wrong(target, sent, await _seen(target, where, pool, rabbit))
            settled_s = time.monotonic() - started
        finally:
            await pool.close()
        lost = _lost(procs)
        if wrong or lost:
            raise AssertionError("\n".join([f"{len(wrong)} wrong after {timeout_s:.0f} s, "
                                            f"{lost} consumers lost", *wrong[:15],
                                            fleet.tails()]))
        hostile = [d for d in sent if d.faults]
        commands_sent = [d for d in sent if not d.faults]
        return Report(len(hostile), sum(d.copies for d in hostile), len(commands_sent),
                      sum(d.copies for d in commands_sent),
                      Counter(f for d in hostile for f in d.faults), publish_s, settled_s,
                      lost)


def _start(fleet: Fleet, target: Target) -> list[Proc]:
    env = {"EO_KEPT_HEADERS": json.dumps([SEQ_HEADER]), "EO_DEAD_LETTER_COLLECT": "true"}
    return [fleet.start(target.gateway, **env), fleet.start(target.downstream, **env)]


async def _clear_store(where: Where) -> None:
    conn = await asyncpg.connect(where.dsn)
    try:
        await conn.execute("TRUNCATE eo_dead_letter")
    finally:
        await conn.close()


def main() -> None:
    """The long campaign outside pytest (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=sorted(TARGETS), default="sample")
    parser.add_argument("--deliveries", type=int, default=10_000)
    parser.add_argument("--commands", type=int, default=1_000)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    target = TARGETS[args.target]()
    with where_for("eo_hostile_long", "eo-hostile-long") as where, \
            tempfile.TemporaryDirectory() as tmp:
        report = asyncio.run(run(target, where, Path(tmp), args.deliveries, args.commands,
                                 args.timeout))
    print(f"{target.name}, seed {SEED}: {report.text()}")


if __name__ == "__main__":
    main()
