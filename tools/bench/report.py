"""The bench's results: their shape, a rich table on stdout and a JSON file."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


@dataclass(frozen=True)
class Params:
    """One bench: `messages` per path over `partitions` accounts, `in_flight` deliveries."""

    messages: int = 3_000
    partitions: int = 1_000
    in_flight: int = 8
    database_dsn: str = "postgresql://postgres@127.0.0.1:5432/eo_bench"
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    seed: int = 1
    #: endpoints and queues are `<prefix>-<path>`, sinks `<prefix>-sink-<path>`
    prefix: str = "bench"


@dataclass
class PathResult:
    """One path's figures: throughput in messages/s, latencies in ms, per-message counts,
    and rows counted once the consumer is idle (`at_rest`: name -> rows)."""

    path: str
    seconds: float
    messages_per_s: float
    p50_ms: float
    p99_ms: float
    round_trips_per_message: float
    pool_resets_per_message: float
    dedup_rows_at_rest: int
    at_rest: dict[str, int]
    settlements: dict[str, int]
    sink_duplicates: int
    breakdown: dict[str, float] = field(default_factory=dict)


@dataclass
class BenchResult:
    """The parameters, the machine (versions) and one `PathResult` per path."""

    params: Params
    machine: dict[str, str]
    paths: list[PathResult]

    def ratio(self, path: str, to: str = "baseline") -> float:
        """Throughput of `path` over that of `to`."""
        by = {p.path: p.messages_per_s for p in self.paths}
        return by[path] / by[to] if by.get(to) else 0.0


def percentile_ms(values_ns: list[int], p: float) -> float:
    """The `p`-quantile (0..1, nearest rank) of `values_ns` (nanoseconds), in milliseconds."""
    ordered = sorted(values_ns)
    return ordered[max(math.ceil(p * len(ordered)) - 1, 0)] / 1e6 if ordered else 0.0


#: How each path counts its deduplication rows at rest (for the table's notes and the JSON).
DEDUP_ROWS = {
    "baseline": "none by construction (no deduplication)",
    "outbox": "processed-message rows of the endpoint, kept for the retention window",
    "token": "incoming tokens left (eo_token rows of the run's message IDs); the outputs' "
             "tokens belong to their receiver (none here): reported as output tokens, deleted",
    "state": "state stream entries (eo_state_entry): one per message until retention "
             "truncates them, keeping each partition's newest snapshot",
}


#: What the latency columns measure.
LATENCY = ("producer publish (sent_at_ns in the body, before the sender's token insert) to "
           "first receipt at the sink; the producer publishes at full speed, so p50/p99 include "
           "the time spent queued behind the backlog")


def as_json(result: BenchResult) -> dict[str, Any]:
    """Everything the table shows plus parameters, machine, per-statement round trips
    (per message) and the rows at rest. Units: seconds, messages/s, milliseconds."""
    params = asdict(result.params)
    params.pop("database_dsn")  # may hold a password; the database name is enough
    params.pop("amqp_url")
    return {
        "parameters": params,
        "machine": result.machine,
        "paths": [{**asdict(p), "dedup_rows_meaning": DEDUP_ROWS[p.path]} for p in result.paths],
        "token_over_baseline_throughput": result.ratio("token"),
        "outbox_over_baseline_throughput": result.ratio("outbox"),
        "state_over_baseline_throughput": result.ratio("state"),
        "latency_meaning": LATENCY,
    }


def write_json(result: BenchResult, path: Path) -> None:
    """Write `as_json(result)` to `path` (parent directories created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(as_json(result), indent=2) + "\n")


def print_table(result: BenchResult, console: Console) -> None:
    """The side-by-side table, the token/baseline ratio and the machine line."""
    p = result.params
    table = Table(title=f"eo bench: {p.messages:,} messages per path, {p.partitions:,} "
                        f"partitions, {p.in_flight} deliveries in flight")
    for column in ("path", "messages/s", "p50 ms", "p99 ms", "DB round trips/msg",
                   "dedup rows at rest"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for r in result.paths:
        table.add_row(r.path, f"{r.messages_per_s:,.0f}", f"{r.p50_ms:,.1f}", f"{r.p99_ms:,.1f}",
                      f"{r.round_trips_per_message:.2f}", f"{r.dedup_rows_at_rest:,}")
    console.print(table)
    console.print(f"token path / baseline throughput = {result.ratio('token'):.2f}"
                  f"   (outbox / baseline = {result.ratio('outbox'):.2f}, "
                  f"state / baseline = {result.ratio('state'):.2f})")
    for r in result.paths:
        rest = r.at_rest
        console.print(
            f"  {r.path}: processed {rest['processed']:,}, incoming tokens left "
            f"{rest['incoming_tokens_left']}, side-effect records left "
            f"{rest['side_effect_records_left']}, unfinished TRs {rest['unfinished_trs']}, "
            f"output tokens (for the receiver) {rest['output_tokens']:,}")
    m = result.machine
    console.print(f"machine: {m['nproc']} CPUs, Python {m['python']}, PostgreSQL "
                  f"{m['postgresql']}, RabbitMQ {m['rabbitmq']}")
    console.print("dedup rows: " + "; ".join(f"{k}: {v}" for k, v in DEDUP_ROWS.items()))
    console.print(f"latency: {LATENCY}")
