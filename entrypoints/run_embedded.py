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

The runner is the public test API's `EmbeddedService` (entrypoints/testing.py) fed from the
lines, with blobs in `EO_BLOB_DIR`.
"""

from __future__ import annotations

from collections.abc import Iterable

from entrypoints.service_spec import Service
from entrypoints.settings import Settings
from entrypoints.testing import EmbeddedReport, run_lines

__all__ = ["EmbeddedReport", "run_embedded"]


async def run_embedded(settings: Settings, service: Service, lines: Iterable[str]
                       ) -> EmbeddedReport:
    """Run every endpoint of `service` on the memory adapters, one consumer per endpoint,
    feed them `lines` (see the module docstring), wait until nothing is left to do, sweep as
    if every grace period had passed, and report."""
    return await run_lines(settings, service, lines)
