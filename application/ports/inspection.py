"""The `StoreInspection` port: read-only views of a service's stores for reports, `eo states`,
`eo inspect` and the at-rest checks (I8, I9), whatever the endpoints' strategies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class AtRest:
    """What the stores hold that messages in flight leave behind: every token (`tokens`, the
    ones dead letters keep for their replay included), and per endpoint the committed but
    unfinished transaction records, the age of the oldest in seconds, the side-effect
    records, the deferred clean-ups, a callee's stored requests and a gateway's unrelayed
    inbox rows (an endpoint with none is left out of each)."""

    tokens: int = 0
    unfinished: dict[str, int] = field(default_factory=dict)
    oldest_unfinished_s: dict[str, float] = field(default_factory=dict)
    side_effect_records: dict[str, int] = field(default_factory=dict)
    deferred_cleanups: dict[str, int] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    inbox_rows: dict[str, int] = field(default_factory=dict)


class StoreInspection(Protocol):
    """Read-only views of every endpoint's stores."""

    async def states(self, endpoint: str, limit: int | None = None,
                     partition: str | None = None) -> dict[str, Any]:
        """Endpoint `endpoint`'s business states, partition key -> the domain's state object,
        in key order: the transaction records' states, or a `state` endpoint's newest stream
        entries; with `limit`, the first `limit` partitions; with `partition`, that one only
        (nothing when it has no state). Raises KeyError for an endpoint it does not know,
        `MalformedMessage` for a stored state that does not decode as the endpoint's state
        type."""

    async def at_rest(self) -> AtRest:
        """What is at rest in the stores now (`AtRest`)."""
