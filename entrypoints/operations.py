"""Operator commands on the real services: create and migrate the databases, inspect the
protocol's state at rest and the dead-letter queues."""

from __future__ import annotations

from dataclasses import dataclass, field

from adapters.postgres.admin import StoresAtRest, database_name, ensure_database, stores_at_rest
from adapters.postgres.migrate import upgrade_async
from adapters.rabbitmq.topology import dead_letter_depths
from entrypoints.settings import Settings


async def migrate_all(settings: Settings) -> list[str]:
    """Create (if missing) and migrate the endpoint database and the token database; returns
    the databases it created."""
    created = []
    for dsn in dict.fromkeys([settings.database(), settings.tokens_database()]):
        if await ensure_database(dsn):
            created.append(database_name(dsn))
        await upgrade_async(dsn)
    return created


@dataclass
class Inspection:
    """What `eo inspect` reports: the stores at rest and each endpoint's dead-letter queue
    depth (None: no queue)."""

    stores: StoresAtRest
    dead_letters: dict[str, int | None] = field(default_factory=dict)


async def inspect(settings: Settings, endpoints: list[str]) -> Inspection:
    """Tokens in flight, committed-but-unfinished transaction records and their age, deferred
    clean-ups per endpoint, and each endpoint's dead-letter queue depth."""
    stores = await stores_at_rest(settings.database(), settings.tokens_database())
    letters = await dead_letter_depths(settings.amqp(), endpoints, len(settings.retry_delays_s))
    return Inspection(stores, letters)
