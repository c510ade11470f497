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
The faults are drawn from `Faults.seed`: a failing run replays with the same seed. The
consumers run on the embedded runtime (entrypoints/embedded_runtime.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import is_dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from dependency_injector import providers

from adapters.localfs.blob_store import LocalDirectoryBlobStore
from adapters.memory.apis import SandboxApis
from adapters.memory.blob_store import MemoryBlobStore
from adapters.memory.broker import MemoryBroker
from adapters.system.clock import OffsetClock
from application.codec import encode, to_jsonable
from application.failpoints import Failpoints
from application.outcome import Outcome
from application.ports import BlobStore, Clock
from application.registry import Registry, Role
from application.strategy import Strategy
from application.workers import Workers
from entrypoints.embedded import EmbeddedContainer
from entrypoints.embedded_producer import (
    EmbeddedProducer,
    Recording,
    body_of,
    json_of,
)
from entrypoints.embedded_report import DeadLetterEntry, EmbeddedReport, Sent, entries_of
from entrypoints.embedded_runtime import EmbeddedRuntime, Faults, generation_task_factory
from entrypoints.faults import fault_logger
from entrypoints.resources import shutdown_resources
from entrypoints.service_spec import Service, resolve_service
from entrypoints.settings import Settings, load_settings


class EmbeddedService:
    """A registry's endpoints running in this process (see the module docstring). Make one
    with `EmbeddedService.start()`; every method is for the event loop it was started in."""

    def __init__(self, settings: Settings, service: Service, faults: Faults,
                 blobs: BlobStore | None) -> None:
        self.settings, self.service, self.faults = settings, service, faults
        self.broker = MemoryBroker(
            shuffle=random.Random(faults.seed + 1) if faults.out_of_order else None,
            dead_letter_max_bytes=settings.rabbitmq.dead_letter_max_bytes)
        self._container = EmbeddedContainer(settings=settings, service=service)
        self._recording = Recording(self.broker)
        self._container.broker.override(self.broker)
        self._container.dispatcher.override(self._recording)
        if blobs is not None:
            self._container.blobs.override(blobs)
        self.runtime = EmbeddedRuntime(
            self.broker, faults, service.registry.consuming(),
            lambda name, source: self.system.consumer_process(name, source))
        self._container.failpoints.override(providers.Object(Failpoints.from_spec(
            faults.failpoints, self.runtime.crash, self.runtime.drop_connection,
            on_fire=fault_logger(self._container.events()))))
        self.system: Workers = self._container.workers()
        self.report = EmbeddedReport(service.registry.service)
        self.producer = EmbeddedProducer(settings, service, self.broker, self.system.tokens)

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
        loop.set_task_factory(generation_task_factory)
        try:
            running.runtime.start_generation()
            yield running
        finally:
            await running.runtime.stop_generation()
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
            body = body_of(message)
        sent_id = uuid.uuid4() if message_id is None else message_id
        await self.producer.publish(queue, str(sent_id), type_name, body, dict(headers or {}))
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
        await self.producer.publish(queue, None if raw_id is None else str(raw_id),
                            None if type_ is None else str(type_),
                            body_of(raw.get("body", {})), headers)

    def _type_name(self, queue: str, message: Any) -> str:
        registration = self.system.registry[queue]
        for name, cls in registration.endpoint.messages.items():
            if type(message) is cls:
                return name
        raise ValueError(f"{queue} does not take {type(message).__name__} (it takes "
                         f"{sorted(registration.endpoint.messages)})")

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
        runtime = self.runtime
        await runtime.until_quiet(quiet_polls)
        later = OffsetClock(self.system.clock, self.system.grace
                            + timedelta(seconds=self.settings.protocol.stale_after_s + 1))
        for name in self.system.registry.names():
            await runtime.surviving(partial(self._sweep, name, later))
        for name in self.system.registry.names(Role.GATEWAY):
            await runtime.surviving(partial(self._relay, name))
        await runtime.until_quiet(quiet_polls)
        await self._fill()
        return self.report

    async def _sweep(self, name: str, clock: Clock) -> None:
        await self.system.sweeper(name, clock).sweep()

    async def _relay(self, name: str) -> None:
        await self.system.relay(name).drain()

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
        inspection: Any = self.system.inspection  # the memory stores': read at once
        return dict(inspection.snapshot(endpoint))

    def outputs(self, to: str | None = None) -> list[Sent]:
        """The messages the endpoints sent (to `to` only, when given), in order."""
        return [Sent(destination, e.message_id, e.type, json_of(e.body), dict(e.headers))
                for destination, e in self._recording.sent if to in (None, destination)]

    def dead_letters(self, queue: str | None = None) -> list[DeadLetterEntry]:
        """The dead letters (of `queue` only, when given), one per message, with their
        reasons, in the order they were first dead-lettered."""
        return entries_of({name: letters for name, letters in self.broker.dead_letters.items()
                           if queue in (None, name)})

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
        found = await self.system.inspection.at_rest()
        return {"tokens in flight": found.tokens - await self.kept_tokens(),
                "unfinished transaction records": sum(found.unfinished.values()),
                "side-effect records": sum(found.side_effect_records.values()),
                "deferred clean-ups": sum(found.deferred_cleanups.values()),
                "requests on callees": sum(found.requests.values()),
                "unrelayed inbox rows": sum(found.inbox_rows.values())}

    async def _fill(self) -> None:
        report, names = self.report, {str(s): 0 for s in Outcome}
        report.published = self.producer.published
        for name, count in self.runtime.settled().items():
            report.settled[name] = {**names, **{str(k): v for k, v in count.items()}}
            # one vocabulary: what the source refuses before processing is dead-lettered too
            report.settled[name][str(Outcome.DEAD_LETTERED)] += self.producer.refused[name]
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
        report.crashes = self.runtime.crashes


async def run_lines(settings: Settings, service: Service, lines: Iterable[str],
                    blobs: BlobStore | None = None) -> EmbeddedReport:
    """`lines` (`eo embedded`'s input format) through `service`'s endpoints, until quiet:
    the report. `blobs` None keeps the profile's (a directory: `EO_BLOB_DIR`)."""
    async with EmbeddedService.start(
            service.registry, settings=settings,
            blobs=blobs or LocalDirectoryBlobStore(settings.blobs.blob_dir)) as running:
        for line in lines:
            await running.send_line(line)
        return await running.run_until_quiet()


__all__ = ["DeadLetterEntry", "EmbeddedReport", "EmbeddedService", "Faults", "Sent", "run_lines"]
