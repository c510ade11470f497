"""What `eo pipeline audit` audits (tools/pipeline/audit.py): the databases, the threshold,
and the registry's endpoints as the audit sees them (`AuditConfig`, made by `audit_config`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from tools.pipeline.sources import Jdbc

if TYPE_CHECKING:
    from entrypoints.service_spec import Service


@dataclass(frozen=True)
class AuditConfig:
    """What to audit and how.

    - `database` / `tokens`: the endpoints' database and the token store (JDBC);
    - `now`, `older_than_s`: orphans, tokens and unfinished transaction records count only
      when older than `now - older_than_s` (UTC);
    - `states`: every endpoint -> the state fields naming blobs (empty: any artifact key in
      the state's JSON): whichever endpoint names an object keeps it from being an orphan;
    - `prefixes`: the prefixes an orphan may have (None: those of the keys named);
    - `streams`: endpoints keeping their states in `eo_state_entry` (strategy `state`);
    - `partitions`: parallel JDBC reads per table.
    """

    database: Jdbc
    tokens: Jdbc
    now: datetime
    older_than_s: float
    states: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    prefixes: tuple[str, ...] | None = None
    streams: frozenset[str] = frozenset()
    partitions: int = 4

    @property
    def cutoff(self) -> datetime:
        """`now - older_than_s`, UTC."""
        return self.now.astimezone(UTC) - timedelta(seconds=self.older_than_s)


def audit_config(service: Service, database: Jdbc, tokens: Jdbc, now: datetime,
                 older_than_s: float, partitions: int = 4) -> AuditConfig:
    """The audit of `service`'s registry (every endpoint's states, the blob endpoints'
    declared fields and prefixes, the `state`-strategy endpoints) on `database` and
    `tokens`."""
    from application.strategy import Strategy

    states = {r.name: r.blob_fields for r in service.registry}
    declared = [p for r in service.registry if r.blobs for p in r.blob_prefixes]
    undeclared = any(r.blobs and not r.blob_prefixes for r in service.registry)
    streams = frozenset(r.name for r in service.registry
                        if service.strategy(r.name) is Strategy.STATE)
    return AuditConfig(database, tokens, now, older_than_s, states,
                       None if undeclared else tuple(sorted(set(declared))), streams,
                       partitions)
