"""The boundary gateway's pure handler: relay outside commands to the endpoint that owns them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.context import Context
from domain.decisions import Decision, Endpoint, Outgoing


@dataclass(frozen=True)
class Relayed:
    """Per-partition count of commands relayed (the gateway keeps no other state)."""

    count: int = 0


def gateway_for(
    target: Endpoint[Any], commands: Mapping[str, type], name: str = "gateway"
) -> Endpoint[Relayed]:
    """A gateway endpoint accepting `commands` (type name -> dataclass) from outside
    producers and relaying each, unchanged, to `target`'s queue, partitioned like `target`
    so one aggregate's commands are relayed one at a time."""
    unknown = set(commands) - set(target.messages)
    if unknown:
        raise ValueError(f"{target.name} does not accept {sorted(unknown)}")

    def handle(state: Relayed | None, message: Any, context: Context) -> Decision[Relayed]:
        count = state.count if state is not None else 0
        return Decision(state=Relayed(count + 1), outgoing=(Outgoing(target.name, message),))

    return Endpoint(name=name, messages=dict(commands), partition_of=target.partition_of,
                    handle=handle, state_type=Relayed, outputs=(target.name,))
