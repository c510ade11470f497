"""The defaults of the protocol's tunables, written once: `entrypoints.settings.Settings`
offers each as an `EO_*` variable with this default, and the application's constructors
take it when a caller (a test, a tool) gives none. docs/configuration.md explains each."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

#: How long after a clear an aborted attempt's artifacts are deleted (protocol 8): longer
#: than any attempt lives (`EO_CLEANUP_GRACE_S`).
CLEANUP_GRACE: Final = timedelta(minutes=30)
#: The sweeper finishes committed transaction records older than this (`EO_STALE_AFTER_S`).
STALE_AFTER: Final = timedelta(seconds=30)
#: How long processed-message rows, relayed inbox rows and HTTP tombstones are kept
#: (`EO_RETENTION_DAYS`).
RETENTION: Final = timedelta(days=7)
#: Immediate retries after an optimistic-concurrency conflict (`EO_CONFLICT_RETRIES`).
CONFLICT_RETRIES: Final = 3
#: Deliveries of a message before it is dead-lettered (`EO_MAX_ATTEMPTS`).
MAX_ATTEMPTS: Final = 5
#: Seconds before the n-th delayed redelivery; the last repeats (`EO_RETRY_DELAYS_S`).
RETRY_DELAYS_S: Final = (0.05, 0.2, 1.0, 5.0)
#: Deliveries in flight of a consumer that processes one at a time (`EO_PREFETCH`).
SINGLE_PREFETCH: Final = 8
#: PostgreSQL connections per pool (`EO_POOL_SIZE`): an attempt holds one from its load to
#: its clear (`PartitionStore.session`), so the unbatched prefetch, plus room for the
#: sweeper, the dead-letter collector and the readiness check.
POOL_SIZE: Final = SINGLE_PREFETCH + 4
#: The prefetch of a batching consumer, in batches: two in process, one waiting
#: (`application.settlement.batches_in_flight`).
PREFETCH_IN_BATCHES: Final = 3
#: The largest body processed; larger ones are dead-lettered (`EO_MAX_BODY_BYTES`).
MAX_BODY_BYTES: Final = 1_048_576
#: The most of a malformed or oversize body a dead letter keeps, with the body's size and
#: SHA-256 (`EO_DEAD_LETTER_BODY_BYTES`).
DEAD_LETTER_BODY_BYTES: Final = 4096
