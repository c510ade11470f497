"""Test your service's endpoints together, in the test's own process: the public test API.

`EmbeddedService` runs every endpoint of a registry on the memory adapters (the `embedded`
profile's stores, broker, inboxes, state streams and third-party API sandboxes; blobs in
memory), one consumer per endpoint (or `Faults.workers`), inside the test's event loop. The
test sends messages as outside producers do, runs until nothing is left to do, and reads
what came of them: the endpoints' states (the domain's own objects), the messages the
endpoints sent each other, the dead letters with their reasons, and what is left at rest.
`eo embedded` is this class fed from a JSON-lines file.

Typical use (pytest with pytest-asyncio)::

    from entrypoints.testing import EmbeddedService, Faults
    from domain.parcels import Ship

    async def test_a_parcel_ships_once() -> None:
        async with EmbeddedService.start() as service:        # the registry of EO_SERVICE
            sent = await service.send("parcels", Ship("p-1", 1200, "lyon"))
            await service.send("parcels", Ship("p-1", 1200, "lyon"), message_id=sent)
            report = await service.run_until_quiet()
        assert service.states("tracking")["lyon"].parcels == ("p-1",)
        assert report.settled["parcels"]["duplicate"] == 1
        assert not any(report.at_rest.values())

With `faults`, the same run meets what a production broker and crashing processes do to it:
copies of deliveries, redeliveries while the first copy is still being processed, deliveries
out of order, several consumers per endpoint, and failpoints (protocol 10, `EO_FAILPOINTS`
syntax) whose `crash` kills the whole service process at that point: every consumer's task
is cancelled where it stands, their unsettled deliveries go back to their queues, and a new
generation of consumers starts on the same stores (what a restart after `kill -9` finds).
The faults are drawn from `Faults.seed`: a failing run replays with the same seed.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, is_dataclass
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from dependency_injector import providers

from adapters.localfs.blob_store import LocalDirectoryBlobStore
from adapters.memory.apis import SandboxApis
from adapters.memory.blob_store import MemoryBlobStore
from adapters.memory.broker import MemoryBroker, MemoryDelivery
from adapters.system.clock import OffsetClock
from application.codec import encode, to_jsonable
from application.dead_letter_copies import letter_digest
from application.envelope import (
    BODY_SHA256_HEADER,
    REASON_HEADER,
    TOKEN_HEADER,
    Envelope,
    admitted,
    capped,
    clipped_body,
    known_headers,
)
from application.errors import Crash, MalformedMessage
from application.failpoints import Failpoints
from application.outcome import Outcome
from application.ports import BlobStore
from application.registry import Registry, Role
from application.settlement import Settler
from application.strategy import Strategy
from entrypoints.embedded import EmbeddedContainer
from entrypoints.faults import fault_logger
from entrypoints.local import shutdown_resources
from entrypoints.settings import Service, Settings, load_settings, resolve_service
from entrypoints.system import System

#: Header of a message dead-lettered before processing: its message ID as the producer gave
#: it (which may not be a UUID).
RAW_ID_HEADER = "eo-line-message-id"
#: The consumers' generation a task belongs to (set for a generation's consumer tasks and
#: inherited by every task they create), so that a crash cancels exactly those.
_GENERATION: contextvars.ContextVar[set[asyncio.Task[Any]] | None] = contextvars.ContextVar(
    "eo_testing_generation", default=None)


@dataclass(frozen=True)
class Faults:
    """What the run meets, drawn from `seed`.

    - `duplicates`: the chance (0 <= p < 1) that a message's first delivery to a queue is
      followed by a copy of it (a producer's retry, a re-publication);
    - `redeliveries`: the chance (0 <= p < 1) that the consumer taking a message's first
      delivery to a queue loses its channel a few milliseconds later: every unsettled
      delivery of that consumer goes back to its queue and is delivered again, maybe while
      the first copy is still being processed (concurrent attempts);
    - `out_of_order`: each delivery is taken from a random place in its queue;
    - `workers`: consumers per endpoint (>= 1);
    - `failpoints`: `EO_FAILPOINTS` rules (application/failpoints.py), e.g.
      `"after_commit=crash@2;after_put=raise@1"`; `crash` kills the service (module
      docstring), `drop_conn` makes every consumer lose its channel.

    Raises ValueError naming the field when a value is out of range or a rule is bad."""

    seed: int = 0
    duplicates: float = 0.0
    redeliveries: float = 0.0
    out_of_order: bool = False
    workers: int = 1
    failpoints: str = ""

    def __post_init__(self) -> None:
        for name in ("duplicates", "redeliveries"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"Faults.{name}: a chance in [0, 1), not "
                                 f"{getattr(self, name)!r}")
        if self.workers < 1:
            raise ValueError(f"Faults.workers: at least 1, not {self.workers!r}")
        Failpoints.from_spec(self.failpoints, _never)  # raises ValueError naming the rule


def _never(name: str) -> None:
    raise AssertionError(name)


@dataclass
class EmbeddedReport:
    """What a run came to: the input published or rejected, every delivery's settlement per
    endpoint (`processed`, `duplicate`, `retried`, `dead_lettered`, `unsettled`), the
    endpoints' states (JSON-ready, by partition), the messages the endpoints sent each other
    (`outputs`), the dead letters with reasons (one per message, `times` its copies), what is
    left at rest (`at_rest`: all zero when every message was consumed or dead-lettered: I8,
    I9), what the protocol keeps at rest on purpose (`kept`: the tokens dead letters keep
    for their replay), the blob keys, and how many crashes were injected."""

    service: str
    lines: int = 0
    published: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    settled: dict[str, dict[str, int]] = field(default_factory=dict)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    at_rest: dict[str, int] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)
    blobs: list[str] = field(default_factory=list)
    crashes: int = 0

    def as_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (`eo embedded --format json`)."""
        return {"service": self.service,
                "input": {"lines": self.lines, "published": self.published,
                          "rejected": self.rejected},
                "settled": self.settled, "states": self.states, "outputs": self.outputs,
                "dead_letters": self.dead_letters, "at_rest": self.at_rest,
                "kept": self.kept, "blobs": self.blobs}


@dataclass(frozen=True)
class Sent:
    """A message an endpoint sent: its destination, message ID, type, JSON body, and its
    headers (the protocol's lineage among them: `eo-causation-id` names the message whose
    processing sent it, `eo-origin-id` the outside message its chain started from)."""

    to: str
    message_id: uuid.UUID
    type: str
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DeadLetter:
    """A dead letter of `queue`: the message ID as sent, its type, the reason (the last
    copy's), and how many copies of the message were dead-lettered (`times`): one entry per
    message, as the dead-letter store keeps them (copies under one message ID with one type
    and body are one message; `application.dead_letters.letter_digest`)."""

    queue: str
    message_id: str
    type: str
    reason: str
    times: int = 1


class _Recording:
    """The system's dispatcher: the broker, keeping what the endpoints send."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.sent: list[tuple[str, Envelope]] = []

    async def dispatch(self, destination: str, envelope: Envelope) -> None:
        self.sent.append((destination, envelope))
        await self.broker.dispatch(destination, envelope)


def _body(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":")).encode()


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


def _generation_task_factory(loop: asyncio.AbstractEventLoop, coro: Any,
                             context: contextvars.Context | None = None) -> asyncio.Task[Any]:
    """The event loop's task factory while a service runs: a task created by a task of a
    consumers' generation (or in its context) joins that generation."""
    task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, context=context)
    generation = context.get(_GENERATION) if context is not None else _GENERATION.get()
    if generation is not None:
        generation.add(task)
        task.add_done_callback(lambda done: _forget(generation, done))
    return task


def _forget(generation: set[asyncio.Task[Any]], task: asyncio.Task[Any]) -> None:
    """A generation's task ended: drop it, its exception retrieved (an injected `Crash` is
    how it was meant to end; anything else is re-raised where the consumer awaits it)."""
    generation.discard(task)
    if not task.cancelled():
        task.exception()


class EmbeddedService:
    """A registry's endpoints running in this process (see the module docstring). Make one
    with `EmbeddedService.start()`; every method is for the event loop it was started in."""

    def __init__(self, settings: Settings, service: Service, faults: Faults,
                 blobs: BlobStore | None) -> None:
        self.settings, self.service, self.faults = settings, service, faults
        self._rng = random.Random(faults.seed)
        #: (queue, message ID) whose first delivery drew its faults already
        self._faulted: set[tuple[str, uuid.UUID]] = set()
        self.broker = MemoryBroker(
            shuffle=random.Random(faults.seed + 1) if faults.out_of_order else None,
            dead_letter_max_bytes=settings.dead_letter_max_bytes)
        self._container = EmbeddedContainer(settings=settings, service=service)
        self._recording = _Recording(self.broker)
        self._container.broker.override(self.broker)
        self._container.dispatcher.override(self._recording)
        if blobs is not None:
            self._container.blobs.override(blobs)
        self._crashed = asyncio.Event()
        self._crashes = 0
        self._container.failpoints.override(providers.Object(Failpoints.from_spec(
            faults.failpoints, self._crash, self._drop_connection,
            on_fire=fault_logger(self._container.events()))))
        self.system: System = self._container.system()
        self.report = EmbeddedReport(service.registry.service)
        self._refused: Counter[str] = Counter()
        self._tokens_sent: set[tuple[str, uuid.UUID]] = set()
        self._counts: dict[str, Counter[Outcome]] = {
            name: Counter() for name in self.system.registry.consuming()}
        self._consumers: dict[str, tuple[str, Settler]] = {}  # tag -> endpoint, consumer
        self._generation: set[asyncio.Task[Any]] = set()
        self._generations = 0

    @classmethod
    @asynccontextmanager
    async def start(cls, registry: Registry | None = None, *, faults: Faults | None = None,
                    settings: Settings | None = None, blobs: BlobStore | None = None,
                    **overrides: Any) -> AsyncIterator[EmbeddedService]:
        """Start the endpoints of `registry` (default: the one `EO_SERVICE` names) with
        `settings` (default: from the environment plus `overrides`, e.g.
        `strategies={"tracking": "state"}`), `faults` (none by default) and `blobs` (default:
        in memory); stop them afterwards. Raises SettingsError naming the variable of a bad
        setting, ValueError for bad faults."""
        settings = settings or load_settings(**overrides)
        service = resolve_service(settings, registry)
        running = cls(settings, service, faults or Faults(), blobs or MemoryBlobStore())
        loop = asyncio.get_running_loop()
        previous = loop.get_task_factory()
        loop.set_task_factory(_generation_task_factory)
        try:
            running._start_generation()
            yield running
        finally:
            await running._stop_generation()
            await shutdown_resources(running._container)  # tracing's spans flushed
            loop.set_task_factory(previous)

    # --- sending ---------------------------------------------------------------------------

    async def send(self, queue: str, message: Any, *, type_name: str | None = None,
                   message_id: uuid.UUID | str | None = None,
                   headers: Mapping[str, str] | None = None) -> uuid.UUID | str:
        """Publish `message` to `queue` as an outside producer does, and return its message
        ID (`message_id`, else a new UUID; send the same ID again for a producer's retry).
        `message` is a domain message (a dataclass: encoded as the service encodes, its type
        the name `queue`'s endpoint registers for its class) or a raw body (bytes, str, or
        JSON-ready data) with its `type_name`. A message the broker source would refuse (a bad
        message ID, an unknown type, a body over `EO_MAX_BODY_BYTES`) is dead-lettered with
        its reason, as on real services. Raises KeyError for a queue no endpoint consumes,
        ValueError for a dataclass `queue`'s endpoint does not register."""
        if queue not in set(self.system.registry.consuming()):
            raise KeyError(f"no queue {queue!r} (the service consumes "
                           f"{sorted(self.system.registry.consuming())})")
        if is_dataclass(message) and not isinstance(message, type):
            type_name = type_name or self._type_name(queue, message)
            body = encode(message)
        else:
            body = _body(message)
        sent_id = uuid.uuid4() if message_id is None else message_id
        await self._publish(queue, str(sent_id), type_name, body, dict(headers or {}))
        return sent_id

    async def send_line(self, line: str) -> None:
        """Publish one line of `eo embedded`'s input format (entrypoints/run_embedded.py); a
        line that is not such a message (not JSON, no queue, an unknown queue) is counted in
        the report's `rejected` with its reason, with the line's number."""
        if not line.strip():
            return
        self.report.lines += 1
        number = self.report.lines
        try:
            raw = json.loads(line)
            if not isinstance(raw, dict):
                raise ValueError("not a JSON object")
            queue = str(raw["queue"])
        except (ValueError, KeyError) as exc:
            self.report.rejected.append({"line": number, "reason": f"not a message: {exc}"})
            return
        consuming = set(self.system.registry.consuming())
        if queue not in consuming:
            self.report.rejected.append({"line": number, "reason": f"unroutable: no queue "
                                         f"{queue!r} (the service consumes {sorted(consuming)})"})
            return
        headers = {str(k): str(v) for k, v in dict(raw.get("headers") or {}).items()}
        raw_id, type_ = raw.get("message_id"), raw.get("type")
        await self._publish(queue, None if raw_id is None else str(raw_id),
                            None if type_ is None else str(type_),
                            _body(raw.get("body", {})), headers)

    def _type_name(self, queue: str, message: Any) -> str:
        registration = self.system.registry[queue]
        for name, cls in registration.endpoint.messages.items():
            if type(message) is cls:
                return name
        raise ValueError(f"{queue} does not take {type(message).__name__} (it takes "
                         f"{sorted(registration.endpoint.messages)})")

    async def _publish(self, queue: str, raw_id: str | None, type_: str | None, body: bytes,
                       headers: dict[str, str]) -> None:
        settings = self.settings
        self.report.published += 1
        try:
            envelope = admitted(raw_id, type_, body, headers, settings.max_body_bytes,
                                settings.kept_headers)
        except MalformedMessage as exc:  # what the AMQP source does before any processing
            clipped, sizes = clipped_body(body, settings.dead_letter_body_bytes)
            self.broker.dead_letters[queue].append(Envelope(
                uuid.uuid4(), str(type_ or ""), clipped,
                MappingProxyType({**known_headers(headers, settings.kept_headers), **sizes,
                                  REASON_HEADER: capped(exc.reason),
                                  RAW_ID_HEADER: "" if raw_id is None else capped(raw_id)})))
            self._refused[queue] += 1
            return
        if self.service.strategy(queue) is Strategy.TOKEN:
            # outside producers cannot feed a token endpoint on real services: the test
            # sends as an upstream endpoint would, creating the message's token once (never
            # again for a copy, protocol 3.3, so a copy after the first was consumed is a
            # duplicate)
            envelope = Envelope(envelope.message_id, envelope.type, body,
                                MappingProxyType({**envelope.headers, TOKEN_HEADER: "1"}))
            if (queue, envelope.message_id) not in self._tokens_sent:
                self._tokens_sent.add((queue, envelope.message_id))
                await self.system.tokens.create(queue, [envelope])
        self.broker.publish(queue, envelope)

    # --- running ---------------------------------------------------------------------------

    async def run_until_quiet(self, timeout_s: float = 60.0, quiet_polls: int = 5
                              ) -> EmbeddedReport:
        """Wait until no message is ready, in flight or waiting for a retry (restarting the
        consumers after each injected crash), sweep every endpoint as if every grace period
        had passed, relay what the gateways' inboxes hold, wait again, and return the report.
        Can be called again after more sends. Raises TimeoutError after `timeout_s` seconds
        of waiting, naming the queues that still hold messages (a message retried forever,
        a consumer that stopped taking deliveries)."""
        try:
            async with asyncio.timeout(timeout_s):
                return await self._run_until_quiet(quiet_polls)
        except TimeoutError:
            raise TimeoutError(f"not quiet after {timeout_s} s: {self.broker.pending()}"
                               ) from None

    async def _run_until_quiet(self, quiet_polls: int) -> EmbeddedReport:
        await self._until_quiet(quiet_polls)
        later = OffsetClock(self.system.clock, self.system.grace
                            + timedelta(seconds=self.settings.stale_after_s + 1))
        for name in self.system.registry.names():
            await self._surviving(lambda name=name: self.system.sweeper(name, later).sweep())
        for name in self.system.registry.names(Role.GATEWAY):
            await self._surviving(lambda name=name: self.system.relay(name).drain())
        await self._until_quiet(quiet_polls)
        await self._fill()
        return self.report

    async def _surviving(self, work: Any) -> None:
        """Run `work()` (a sweep, a relay) until it ends without an injected crash: a crash
        there kills the service too; the work is done again by the restarted one."""
        while True:
            try:
                await work()
                return
            except Crash:
                await self._restart()

    async def _until_quiet(self, quiet_polls: int) -> None:
        quiet = 0
        while quiet < quiet_polls:
            await asyncio.sleep(0.01)
            if self._crashed.is_set():
                await self._restart()
                quiet = 0
                continue
            quiet = quiet + 1 if self.broker.idle() else 0

    def _crash(self, name: str) -> None:
        """The `crash` failpoint action: the service dies here (the caller's task ends with
        `Crash`); `_restart` cancels the rest of its generation."""
        self._crashes += 1
        self._crashed.set()
        current = asyncio.current_task()
        for task in self._generation:  # the others stop at their next await, as if killed
            if task is not current:
                task.cancel()
        raise Crash(name)

    async def _drop_connection(self) -> None:
        """The `drop_conn` failpoint action: every consumer loses its channel."""
        for consumer in list(self._consumers):
            self.broker.drop_consumer(consumer)

    async def _restart(self) -> None:
        await self._stop_generation()
        self._crashed.clear()
        self._start_generation()

    def _start_generation(self) -> None:
        self._generations += 1
        self._generation = set()
        token = _GENERATION.set(self._generation)
        try:
            for name in self.system.registry.consuming():
                for worker in range(self.faults.workers):
                    tag = f"{name}-{self._generations}-{worker}"
                    consumer = self.system.consumer(name)
                    self._consumers[tag] = (name, consumer)
                    self._generation.add(asyncio.create_task(consumer.serve(
                        self._deliveries(name, tag),
                        self.settings.prefetch_for(consumer.batches))))
        finally:
            _GENERATION.reset(token)

    async def _stop_generation(self) -> None:
        """Cancel every task of the running generation where it stands, put their unsettled
        deliveries back, and keep their settlement counts."""
        tasks = list(self._generation)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for tag, (name, consumer) in self._consumers.items():
            self.broker.drop_consumer(tag)
            self._counts[name].update(consumer.counts)
        self._consumers = {}

    async def _deliveries(self, queue: str, tag: str) -> AsyncIterator[MemoryDelivery]:
        """`queue`'s deliveries for consumer `tag`, with the faults' copies and channel
        losses."""
        faults, loop = self.faults, asyncio.get_running_loop()
        async for delivery in self.broker.consume(queue, tag):
            first = (queue, delivery.envelope.message_id) not in self._faulted
            if first and (faults.duplicates or faults.redeliveries):
                # a message's first delivery only: faults drawn on every delivery would
                # breed (each channel loss redelivers the consumer's whole prefetch, each
                # redelivery a new chance of a copy and of another loss) and, with many
                # deliveries in flight, never end
                self._faulted.add((queue, delivery.envelope.message_id))
                if faults.duplicates and self._rng.random() < faults.duplicates:
                    self.broker.publish(queue, delivery.envelope)
                if faults.redeliveries and self._rng.random() < faults.redeliveries:
                    loop.call_later(self._rng.uniform(0.0, 0.02), self.broker.drop_consumer,
                                    tag)
            yield delivery

    def seed_states(self, endpoint: str, states: Mapping[str, Any]) -> None:
        """Write initial states of `endpoint`'s partitions (`states`: partition key -> the
        domain's state), as a service's data existing before the test (accounts opened).
        Raises KeyError for an unknown endpoint, ValueError for a `state`-strategy endpoint
        (its states are a stream's snapshots)."""
        if self.service.strategy(endpoint) is Strategy.STATE:
            raise ValueError(f"{endpoint} keeps its states in a stream (the state strategy): "
                             "seed a transactional endpoint")
        store: Any = self.system.stores[endpoint]
        for partition, state in states.items():
            store.seed_state(partition, state)

    # --- reading ---------------------------------------------------------------------------

    def api_executions(self) -> dict[str, dict[str, int]]:
        """Per third-party API, the executions per idempotency key at its in-process
        sandbox provider (each key once: the provider's idempotency held)."""
        routes = getattr(self.system.apis, "routes", {})
        return {name: dict(route.provider.executions) for name, route in routes.items()
                if isinstance(route, SandboxApis)}

    def states(self, endpoint: str) -> dict[str, Any]:
        """The states of `endpoint` by partition key, as its domain objects (a `state`
        endpoint's newest snapshots). Raises KeyError for an unknown endpoint."""
        store: Any = self.system.stores[endpoint]
        return dict(sorted(store.states().items()))

    def outputs(self, to: str | None = None) -> list[Sent]:
        """The messages the endpoints sent (to `to` only, when given), in order."""
        return [Sent(destination, e.message_id, e.type, _json(e.body), dict(e.headers))
                for destination, e in self._recording.sent if to in (None, destination)]

    def dead_letters(self, queue: str | None = None) -> list[DeadLetter]:
        """The dead letters (of `queue` only, when given), one per message, with their
        reasons, in the order they were first dead-lettered."""
        merged: dict[tuple[str, str, str], DeadLetter] = {}
        for name, letters in self.broker.dead_letters.items():
            if queue not in (None, name):
                continue
            for e in letters:
                message_id = e.header(RAW_ID_HEADER) or str(e.message_id)
                key = (name, message_id, letter_digest(e.type, e.body,
                                                       e.header(BODY_SHA256_HEADER)))
                known = merged.get(key)
                merged[key] = DeadLetter(name, message_id, e.type,
                                         e.header(REASON_HEADER) or "",
                                         known.times + 1 if known is not None else 1)
        return list(merged.values())

    async def kept_tokens(self) -> int:
        """Tokens the dead letters keep on purpose, for their replay (`eo inspect`'s "kept
        by dead letters"): not in flight."""
        return await self.system.tokens.count_of(
            [(name, e.message_id) for name, letters in self.broker.dead_letters.items()
             for e in letters])

    async def at_rest(self) -> dict[str, int]:
        """What is left in the stores that nothing will take further: tokens in flight (not
        those dead letters keep: `kept_tokens`), unfinished transaction records, side-effect
        records, deferred clean-ups (after a sweep as if every grace had passed), requests on
        callees, unrelayed inbox rows. All zero once every message was consumed or
        dead-lettered (I8, I9)."""
        system, rest = self.system, Counter[str]()
        rest["tokens in flight"] = await system.tokens.count() - await self.kept_tokens()
        for name in system.registry.names():
            store: Any = system.stores[name]
            rest["unfinished transaction records"] += await store.unfinished_count()
            rest["side-effect records"] += store.record_count()
            rest["deferred clean-ups"] += await store.cleanup_count()
        for requests in system.requests.values():
            rest["requests on callees"] += await requests.count()
        for inbox in system.inboxes.values():
            rest["unrelayed inbox rows"] += await inbox.count_pending()
        return dict(rest)

    async def _fill(self) -> None:
        report, names = self.report, {str(s): 0 for s in Outcome}
        counts = {name: Counter(c) for name, c in self._counts.items()}
        for name, consumer in self._consumers.values():
            counts[name].update(consumer.counts)
        for name, count in counts.items():
            report.settled[name] = {**names, **{str(k): v for k, v in count.items()}}
            # one vocabulary: what the source refuses before processing is dead-lettered too
            report.settled[name][str(Outcome.DEAD_LETTERED)] += self._refused[name]
        report.states = {name: {p: to_jsonable(s) for p, s in self.states(name).items()}
                         for name in self.system.registry.names()}
        report.outputs = [{"to": s.to, "message_id": str(s.message_id), "type": s.type,
                           "body": s.body} for s in self.outputs()]
        report.dead_letters = {}
        for letter in self.dead_letters():
            report.dead_letters.setdefault(letter.queue, []).append(
                {"message_id": letter.message_id, "type": letter.type,
                 "reason": letter.reason, "times": letter.times})
        report.at_rest = await self.at_rest()
        report.kept = {"tokens kept by dead letters": await self.kept_tokens()}
        blobs = self.system.blobs
        report.blobs = await blobs.keys() if blobs is not None else []
        report.crashes = self._crashes


async def run_lines(settings: Settings, service: Service, lines: Iterable[str],
                    blobs: BlobStore | None = None) -> EmbeddedReport:
    """`lines` (`eo embedded`'s input format) through `service`'s endpoints, until quiet:
    the report. `blobs` None keeps the profile's (a directory: `EO_BLOB_DIR`)."""
    async with EmbeddedService.start(
            service.registry, settings=settings,
            blobs=blobs or LocalDirectoryBlobStore(settings.blob_dir)) as running:
        for line in lines:
            await running.send_line(line)
        return await running.run_until_quiet()


__all__ = ["DeadLetter", "EmbeddedReport", "EmbeddedService", "Faults", "Sent", "run_lines"]
