"""What `eo embedded`, `eo endpoints`, `eo inspect` and `eo states` print for people (rich
tables)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from application.dead_letters import ActionResult
from application.records import DeadLetter
from application.registry import Role
from application.strategy import Strategy
from entrypoints.settings import Service

if TYPE_CHECKING:  # what they print, not what they import (`eo dead-letters list` stays light)
    from entrypoints.operations import Inspection
    from entrypoints.run_embedded import EmbeddedReport
    from entrypoints.states import StatesPage

console = Console(highlight=False)


def print_endpoints(service: Service) -> None:
    """The registry as a table: name, role, strategy, the queues it declares, what it uses
    (blobs, the callees and the third-party APIs it calls, a callee's stored requests)."""
    registry = service.registry
    table = Table("endpoint", "role", "strategy", "queues", "uses",
                  title=f"service {registry.service}")
    for r in registry:
        uses = [*(["blobs"] if r.blobs else []), *(f"calls {c}" for c in r.callees),
                *(f"calls API {a}" for a in r.apis)]
        if r.role is Role.CALLEE:
            uses.append(f"stored requests: {r.stored_request}")
        table.add_row(r.name, str(r.role), str(service.strategy(r.name)),
                      ", ".join(registry.queues_of(r.name)) or "-", ", ".join(uses) or "-")
    console.print(table)


def print_inspection(service: Service, found: Inspection) -> None:
    """`eo inspect`'s table: per endpoint, unfinished transactions, their age, deferred
    clean-ups (those whose artifacts are gone apart: nothing left to delete), the dead
    letters waiting in the queue and in the store."""
    stores = found.stores
    table = Table("endpoint", "unfinished TRs", "oldest (s)",
                  "deferred clean-ups (artifacts gone)",
                  "dead letters (queue)", "dead letters (store)",
                  title=f"tokens in flight: {found.tokens_in_flight}; kept by dead letters: "
                        f"{found.dead_letter_tokens}")
    for name in service.registry.names():
        dlq = found.dead_letters.get(name)
        cleanups: Mapping[str, int] = found.cleanups.get(name, {})
        deferred = str(stores.deferred_cleanups.get(name, 0))
        if cleanups.get("gone"):
            deferred += f" ({cleanups['gone']} gone)"  # artifacts deleted already
        kept = found.kept.get(name, {})
        table.add_row(name, str(stores.unfinished.get(name, 0)),
                      f"{stores.oldest_unfinished_s.get(name, 0.0):.1f}", deferred,
                      "-" if name not in found.dead_letters else
                      "no queue" if dlq is None else str(dlq),
                      ", ".join(f"{n} {s}" for s, n in sorted(kept.items())) or "0")
    console.print(table)


def print_states(page: StatesPage) -> None:
    """`eo states`' table: one row per partition, its state as compact JSON."""
    where = "its stream's newest entries" if page.strategy is Strategy.STATE else \
        "its transaction records"
    shown = len(page.states)
    title = (f"{page.endpoint}: the first {shown} partitions by key (more: --limit, "
             "--partition)" if page.more else
             f"{page.endpoint}: {shown} partition{'' if shown == 1 else 's'}")
    table = Table("partition", "state", title=f"{title}; from {where}")
    for partition, state in page.as_json()["states"].items():
        table.add_row(partition, _compact(state, 400))
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


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def print_dead_letters(letters: Sequence[DeadLetter]) -> None:
    """`eo dead-letters list`: one row per dead letter, oldest first."""
    now = datetime.now(UTC)
    table = Table("ID", "endpoint", "status", "age", "times", "reason", "message ID",
                  "origin (producer's message ID)", title=f"{len(letters)} dead letters")
    for d in letters:
        origin = d.origin_id or "-"
        if d.origin_producer:
            origin = f"{origin} ({d.origin_producer})"
        table.add_row(str(d.dead_letter_id), d.endpoint, str(d.status),
                      _age((now - d.last_at).total_seconds()), str(len(d.reasons)),
                      _compact(d.reason, 70).strip('"'),
                      str(d.message_id or d.raw_message_id or "-"), origin)
    console.print(table)


def print_dead_letter(letter: DeadLetter, token_exists: bool | None) -> None:
    """`eo dead-letters show`: one dead letter whole."""
    d = letter
    console.print(f"[bold]dead letter {d.dead_letter_id}[/bold] of {d.endpoint}: {d.status}"
                  + (f" by {d.acted_by} at {d.acted_at:%Y-%m-%d %H:%M:%S}Z" if d.acted_by
                     and d.acted_at else "")
                  + (f" ({d.discard_reason})" if d.discard_reason else ""))
    console.print(f"  message ID {d.message_id or d.raw_message_id or '-'}, type {d.type}, "
                  f"producer {d.producer or '(unauthenticated)'}; origin {d.origin_id}"
                  + (f" from {d.origin_producer}" if d.origin_producer else ""))
    token = {None: "no token (its endpoint deduplicates by message ID)",
             True: "its token exists: a replay is processed",
             False: "its token is gone: a replay is dropped as a duplicate"}[token_exists]
    console.print(f"  {'replayable' if d.replayable else 'not replayable (clipped body)'}; "
                  f"{token}; replayed {d.replays} times")
    for r in d.reasons:
        console.print(f"  {r.at:%Y-%m-%d %H:%M:%S}Z attempt {r.attempt}: {r.reason}")
    if d.headers:
        console.print(f"  headers: {_compact(dict(d.headers), 400)}")
    try:
        body: object = json.loads(d.body)
    except ValueError:
        body = d.body.decode(errors="replace")
    console.print(f"  body: {_compact(body, 2000)}")


def print_results(results: Sequence[ActionResult]) -> None:
    """What `eo dead-letters replay` / `discard` did to each dead letter."""
    for r in results:
        mark = "[green]done[/green]" if r.done else "[red]refused[/red]"
        console.print(f"{r.dead_letter_id}: {mark}: {r.detail}")
    if not results:
        console.print("no dead letter selected")
