"""What every profile's composition root shares: the tunables made once from the settings,
and the service's workers assembled on a profile's adapters."""

from __future__ import annotations

from datetime import timedelta

from application.wiring import Adapters, Tunables
from application.workers import Workers
from entrypoints.service_spec import Service
from entrypoints.settings import Settings


def tunables_of(settings: Settings) -> Tunables:
    """The protocol's tunables of `settings` (`EO_*` seconds and days as `timedelta`; an
    unset `EO_MAX_STATE_BYTES`, 0, as unbounded)."""
    s, p = settings, settings.protocol
    return Tunables(
        conflict_retries=p.conflict_retries, cleanup_grace=timedelta(seconds=p.cleanup_grace_s),
        stale_after=timedelta(seconds=p.stale_after_s),
        retention=timedelta(days=p.retention_days), max_state_bytes=p.max_state_bytes or None,
        max_attempts=p.max_attempts, retry_delays_s=tuple(p.retry_delays_s),
        max_body_bytes=p.max_body_bytes, dead_letter_body_bytes=p.dead_letter_body_bytes,
        batch_size=p.batch_size, batch_wait_s=p.batch_wait_ms / 1000, prefetch=p.prefetch,
        inbox_batch=p.inbox_batch,
        dead_letter_retention=timedelta(days=s.dead_letters.dead_letter_retention_days),
        api_key_retention={name: timedelta(seconds=api.key_retention_s)
                           for name, api in s.http.apis.items()
                           if api.key_retention_s is not None})


def workers_of(service: Service, adapters: Adapters, tunables: Tunables) -> Workers:
    """`service`'s endpoints on `adapters` (`Workers`). Raises ValueError as `Workers`."""
    return Workers(service.registry, service.strategies, adapters, tunables)
