"""`eo embedded`: every endpoint of the service in one process on the memory adapters, fed
messages in the outside producers' format (JSON lines), with a report of what came of them.

One input line is one AMQP message as an outside producer publishes it::

    {"queue": "gateway", "message_id": "<uuid>", "type": "PlaceOrder", "body": {...},
     "headers": {...}}

`queue` is the endpoint's queue (the routing key on the default exchange), `message_id` the
AMQP message ID (a UUID; the same for every copy of one message), `type` the message's type
name, `body` its JSON body (an object, or a string taken as the raw body), `headers`
optional. A message that RabbitMQ would deliver but the service cannot accept (no or bad
message ID, no type, a body over `EO_MAX_BODY_BYTES`) is dead-lettered with its reason, as
on real services; a line that is not such a message at all (not JSON, no queue, an unknown
queue: unroutable) is reported as rejected.

To an endpoint using the token strategy, which outside producers cannot feed on real
services (they send to a gateway or an outbox endpoint), the runner sends as an upstream
endpoint of the service would: it creates the message's token first.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from adapters.memory.broker import MemoryBroker
from application.codec import to_jsonable
from application.envelope import (
    REASON_HEADER,
    TOKEN_HEADER,
    Envelope,
    admitted,
    capped,
    clipped_body,
    known_headers,
)
from application.errors import MalformedMessage
from application.outcome import Outcome
from application.ports import Clock
from application.registry import Role
from application.settlement import Consumer
from application.strategy import Strategy
from entrypoints.embedded import EmbeddedContainer
from entrypoints.local import shutdown_resources
from entrypoints.settings import Service, Settings
from entrypoints.system import System

#: Header of a line dead-lettered before processing: the message ID as the line gave it.
_RAW_ID = "eo-line-message-id"


@dataclass
class EmbeddedReport:
    """What `run_embedded` found: the input lines published or rejected, every delivery's
    settlement per endpoint, the endpoints' states, the messages the endpoints sent to each
    other (`outputs`), the dead letters with reasons, and what is left at rest (all zero
    when every message was consumed: I8, I9)."""

    service: str
    lines: int = 0
    published: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    settled: dict[str, dict[str, int]] = field(default_factory=dict)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    at_rest: dict[str, int] = field(default_factory=dict)
    blobs: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {"service": self.service,
                "input": {"lines": self.lines, "published": self.published,
                          "rejected": self.rejected},
                "settled": self.settled, "states": self.states, "outputs": self.outputs,
                "dead_letters": self.dead_letters, "at_rest": self.at_rest,
                "blobs": self.blobs}


class _Recording:
    """The system's dispatcher: the broker, keeping what the endpoints send."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.sent: list[tuple[str, Envelope]] = []

    async def dispatch(self, destination: str, envelope: Envelope) -> None:
        self.sent.append((destination, envelope))
        await self.broker.dispatch(destination, envelope)


class _Later:
    """A clock `offset` ahead: the final sweep acts as if every grace period had passed."""

    def __init__(self, clock: Clock, offset: timedelta) -> None:
        self.clock, self.offset = clock, offset

    def now(self) -> datetime:
        return self.clock.now() + self.offset


def _body(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":")).encode()


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


async def _feed(system: System, broker: MemoryBroker, settings: Settings,
                lines: Iterable[str], report: EmbeddedReport, refused: Counter[str]) -> None:
    """Publish `lines`; a message the AMQP source would refuse is dead-lettered here, as it
    would be there, and counted in `refused` (per queue)."""
    consuming = set(system.registry.consuming())
    tokens_sent: set[tuple[str, uuid.UUID]] = set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        report.lines += 1
        try:
            raw = json.loads(line)
            if not isinstance(raw, dict):
                raise ValueError("not a JSON object")
            queue = str(raw["queue"])
        except (ValueError, KeyError) as exc:
            report.rejected.append({"line": number, "reason": f"not a message: {exc}"})
            continue
        if queue not in consuming:
            report.rejected.append({"line": number, "reason": f"unroutable: no queue "
                                    f"{queue!r} (the service consumes {sorted(consuming)})"})
            continue
        headers = {str(k): str(v) for k, v in dict(raw.get("headers") or {}).items()}
        body = _body(raw.get("body", {}))
        raw_id, type_ = raw.get("message_id"), raw.get("type")
        report.published += 1
        try:
            envelope = admitted(None if raw_id is None else str(raw_id),
                                None if type_ is None else str(type_), body, headers,
                                settings.max_body_bytes, settings.kept_headers)
        except MalformedMessage as exc:  # what the AMQP source does before any processing
            clipped, sizes = clipped_body(body, settings.dead_letter_body_bytes)
            broker.dead_letters[queue].append(Envelope(
                uuid.uuid4(), str(type_ or ""), clipped,
                MappingProxyType({**known_headers(headers, settings.kept_headers), **sizes,
                                  REASON_HEADER: capped(exc.reason),
                                  _RAW_ID: "" if raw_id is None else capped(str(raw_id))})))
            refused[queue] += 1
            continue
        if system.service.strategy(queue) is Strategy.TOKEN:
            envelope = Envelope(envelope.message_id, envelope.type, body,
                                MappingProxyType({**envelope.headers, TOKEN_HEADER: "1"}))
            if (queue, envelope.message_id) not in tokens_sent:
                # as an upstream sender: one token per message, never re-created for a
                # copy (protocol 3.3), so a copy after the first was consumed is a duplicate
                tokens_sent.add((queue, envelope.message_id))
                await system.tokens.create(queue, [envelope])
        broker.publish(queue, envelope)


async def _until_idle(broker: MemoryBroker, quiet_polls: int = 5) -> None:
    quiet = 0
    while quiet < quiet_polls:
        await asyncio.sleep(0.01)
        quiet = quiet + 1 if broker.idle() else 0


async def run_embedded(settings: Settings, service: Service, lines: Iterable[str]
                       ) -> EmbeddedReport:
    """Run every endpoint of `service` on the memory adapters, one consumer per endpoint
    with a work queue, feed them `lines` (see the module docstring), wait until nothing is
    left to do, sweep as if every grace period had passed, and report."""
    container = EmbeddedContainer(settings=settings, service=service)
    broker = MemoryBroker()
    recording = _Recording(broker)
    container.broker.override(broker)
    container.dispatcher.override(recording)
    system: System = container.system()
    report = EmbeddedReport(service.registry.service)
    consumers: dict[str, Consumer] = {name: system.consumer(name)
                                      for name in system.registry.consuming()}
    tasks = [asyncio.create_task(consumer.serve(broker.consume(name, f"embedded-{name}"),
                                                settings.prefetch_for(consumer.batches)))
             for name, consumer in consumers.items()]
    relays = [system.relay(name) for name in system.registry.names(Role.GATEWAY)]
    refused: Counter[str] = Counter()
    try:
        await _feed(system, broker, settings, lines, report, refused)
        await _until_idle(broker)
        later = _Later(system.clock, system.grace + timedelta(seconds=settings.stale_after_s + 1))
        for name in system.registry.names():
            await system.sweeper(name, later).sweep()
        for relay in relays:
            await relay.drain()
        await _until_idle(broker)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await shutdown_resources(container)  # tracing's spans flushed
    await _fill(report, system, broker, recording, consumers, refused)
    return report


async def _fill(report: EmbeddedReport, system: System, broker: MemoryBroker,
                recording: _Recording, consumers: dict[str, Consumer],
                refused: Counter[str]) -> None:
    names = {str(s): 0 for s in Outcome}
    for name, consumer in consumers.items():
        report.settled[name] = {**names, **{str(k): v for k, v in consumer.counts.items()}}
        # one vocabulary: what the source refuses before processing is dead-lettered too
        report.settled[name][str(Outcome.DEAD_LETTERED)] += refused[name]
    for name in system.registry.names():
        store: Any = system.stores[name]
        report.states[name] = {p: to_jsonable(s) for p, s in sorted(store.states().items())}
    report.outputs = [{"to": destination, "message_id": str(e.message_id), "type": e.type,
                       "body": _json(e.body)} for destination, e in recording.sent]
    for queue, letters in broker.dead_letters.items():
        report.dead_letters[queue] = [
            {"message_id": e.header(_RAW_ID) or str(e.message_id), "type": e.type,
             "reason": e.header(REASON_HEADER)} for e in letters]
    rest: Counter[str] = Counter()
    rest["tokens"] = await system.tokens.count()
    for name in system.registry.names():
        store = system.stores[name]
        rest["unfinished transaction records"] += await store.unfinished_count()
        rest["side-effect records"] += store.record_count()
        rest["deferred clean-ups"] += await store.cleanup_count()
    for requests in system.requests.values():
        rest["requests on callees"] += await requests.count()
    for inbox in system.inboxes.values():
        rest["unrelayed inbox rows"] += await inbox.count_pending()
    report.at_rest = dict(rest)
    report.blobs = await system.blobs.keys() if system.blobs is not None else []
