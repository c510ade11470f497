"""What `eo embedded`, `eo endpoints` and `eo inspect` print for people (rich tables)."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from application.registry import Role
from entrypoints.operations import Inspection
from entrypoints.run_embedded import EmbeddedReport
from entrypoints.settings import Service

console = Console(highlight=False)


def print_endpoints(service: Service) -> None:
    """The registry as a table: name, role, strategy, the queues it declares, what it uses."""
    registry = service.registry
    table = Table("endpoint", "role", "strategy", "queues", "uses",
                  title=f"service {registry.service}")
    for r in registry:
        uses = [*(["blobs"] if r.blobs else []), *(f"calls {c}" for c in r.callees)]
        if r.role is Role.CALLEE:
            uses.append(f"stored requests: {r.stored_request}")
        table.add_row(r.name, str(r.role), str(service.strategy(r.name)),
                      ", ".join(registry.queues_of(r.name)) or "-", ", ".join(uses) or "-")
    console.print(table)


def print_inspection(service: Service, found: Inspection) -> None:
    """`eo inspect`'s table: per endpoint, unfinished transactions, their age, deferred
    clean-ups and dead letters."""
    stores = found.stores
    table = Table("endpoint", "unfinished TRs", "oldest (s)", "deferred clean-ups",
                  "dead letters", title=f"tokens in flight: {stores.tokens}")
    for name in service.registry.names():
        dlq = found.dead_letters.get(name)
        table.add_row(name, str(stores.unfinished.get(name, 0)),
                      f"{stores.oldest_unfinished_s.get(name, 0.0):.1f}",
                      str(stores.deferred_cleanups.get(name, 0)),
                      "-" if name not in found.dead_letters else
                      "no queue" if dlq is None else str(dlq))
    console.print(table)


def _compact(value: object, limit: int = 160) -> str:
    text = json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def print_embedded(report: EmbeddedReport) -> None:
    """`eo embedded`'s report: input, settlements, states, messages sent, dead letters, at
    rest."""
    console.print(f"[bold]{report.service}[/bold]: {report.lines} input lines, "
                  f"{report.published} published, {len(report.rejected)} rejected")
    for rejected in report.rejected:
        console.print(f"  [red]line {rejected['line']}[/red]: {rejected['reason']}")
    settled = Table("endpoint", "processed", "duplicate", "retried", "dead-lettered",
                    "unsettled", title="deliveries")
    for name, counts in report.settled.items():
        settled.add_row(name, *(str(counts.get(k, 0)) for k in
                                ("processed", "duplicate", "retried", "dead_lettered",
                                 "unsettled")))
    console.print(settled)
    states = Table("endpoint", "partition", "state", title="states")
    for name, partitions in report.states.items():
        for partition, state in partitions.items():
            states.add_row(name, partition, _compact(state))
    console.print(states)
    sent = Table("to", "type", "message ID", "body", title="messages sent by the endpoints")
    for out in report.outputs:
        sent.add_row(out["to"], out["type"], out["message_id"], _compact(out["body"], 80))
    console.print(sent)
    for queue, letters in report.dead_letters.items():
        for letter in letters:
            console.print(f"[red]dead letter[/red] {queue} {letter['message_id']} "
                          f"({letter['type']}): {letter['reason']}")
    rest = ", ".join(f"{k}: {v}" for k, v in report.at_rest.items())
    console.print(f"at rest: {rest}; blobs: {len(report.blobs)}")
