"""Operator commands on the real services: create and migrate the databases, inspect the
protocol's state at rest, the dead-letter queues and the dead-letter store."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from adapters.postgres.admin import database_name, ensure_database
from adapters.postgres.migrate import Upgrade, upgrade_reporting
from adapters.rabbitmq.topology import dead_letter_depths
from application.ports import AtRest
from application.side_effects import SideEffects
from application.workers import Workers
from entrypoints.local import LocalContainer
from entrypoints.resources import provided, shutdown_resources
from entrypoints.service_spec import Service
from entrypoints.settings import Settings


async def migrate_all(settings: Settings) -> list[str]:
    """Create (if missing) and migrate the endpoint database and the token database; returns
    the databases it created."""
    return [name for name, created, _ in await migrate_reporting(settings) if created]


async def migrate_reporting(settings: Settings) -> list[tuple[str, bool, Upgrade]]:
    """`migrate_all`, saying for each database (the endpoints', then the tokens' when it is
    another) its name, whether it was created, and what was applied (`Upgrade`)."""
    done = []
    for dsn in dict.fromkeys([settings.database(), settings.tokens_database()]):
        created = await ensure_database(dsn)
        done.append((database_name(dsn), created, await upgrade_reporting(dsn)))
    return done


@dataclass
class Inspection:
    """What `eo inspect` reports: the stores at rest (`stores.tokens` counts every token),
    the tokens dead letters keep (`dead_letter_tokens`, apart from those in flight), each
    endpoint's dead-letter queue depth (None: no queue) and dead letters in the store by
    status, and its deferred clean-ups by whether their artifacts are still there
    (`"present"`, `"gone"`, `"unknown"`: an HTTP request)."""

    stores: AtRest
    dead_letters: dict[str, int | None] = field(default_factory=dict)
    dead_letter_tokens: int = 0
    kept: dict[str, dict[str, int]] = field(default_factory=dict)
    cleanups: dict[str, Counter[str]] = field(default_factory=dict)

    @property
    def tokens_in_flight(self) -> int:
        """Tokens of messages in flight: not those dead letters keep."""
        return self.stores.tokens - self.dead_letter_tokens


async def inspect(settings: Settings, service: Service) -> Inspection:
    """Tokens in flight, committed-but-unfinished transaction records and their age,
    deferred clean-ups per endpoint (asking the blob and token stores whether each artifact
    is still there), each endpoint's dead-letter queue depth and its dead letters in the
    store. Raises asyncpg's, aio_pika's and the blob store's errors."""
    container = LocalContainer(settings=settings, service=service)
    container.connection_name.override("eo inspect")
    try:
        workers: Workers = await provided(container.workers)
        found = Inspection(await workers.inspection.at_rest(), await dead_letter_depths(
            settings.amqp(), service.registry.consuming()))
        gauges = await (await provided(container.dead_letter_operations)).gauges()
        found.dead_letter_tokens, found.kept = gauges.tokens, gauges.counts
        effects = SideEffects(workers.tokens, workers.dispatcher, workers.blobs, workers.http)
        later = datetime.now(UTC) + timedelta(days=3650)  # every one, due or not
        for name in service.registry.names():
            counted: Counter[str] = Counter()
            for item in await workers.stores[name].due_cleanups(later):
                there = await effects.present(item.kind, item.key, item.payload)
                counted[{True: "present", False: "gone", None: "unknown"}[there]] += 1
            found.cleanups[name] = counted
    finally:
        await shutdown_resources(container)
    return found
