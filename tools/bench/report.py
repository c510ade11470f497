"""The bench's results: their shape, a rich table on stdout and a JSON file."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from application.defaults import PREFETCH_IN_BATCHES, SINGLE_PREFETCH
from tools.bench.shapes import Shape

#: The references every path is compared with (tools/bench/references.py).
REFERENCES = ("minimal", "minimal-batched", "faststream", "dbos")

DEFAULT_RUNS: tuple[tuple[str, int], ...] = (
    ("token", 1), ("token-batched", 1), ("outbox", 1), ("state", 1),
    ("minimal", 1), ("minimal-batched", 1), ("faststream", 1), ("dbos", 1),
    ("token-batched", 2), ("minimal-batched", 2))


@dataclass(frozen=True)
class Params:
    """One bench: `messages` per run over `partitions` accounts; `in_flight` deliveries per
    unbatched consumer, batched consumers `PREFETCH_IN_BATCHES * batch_size` (waiting
    `batch_wait_ms` for a batch to fill); `runs` as (path, consumer processes), each run
    `rounds` times, interleaved, under each load shape of `shapes` (tools/bench/shapes.py;
    a big state's shape drains fewer messages: `Shape.messages_for`); latency at
    `load_ratio` of the run's throughput, over up to `latency_messages` messages."""

    messages: int = 10_000
    partitions: int = 1_000
    in_flight: int = SINGLE_PREFETCH  # the template's default for a consumer that does not batch
    batch_size: int = 50
    database_dsn: str = "postgresql://postgres@127.0.0.1:5432/eo_bench"
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    seed: int = 1
    #: queues are `<prefix>-<path>-<processes>`, sinks `<prefix>-sink-<path>-<processes>`
    prefix: str = "bench"
    rounds: int = 1
    load_ratio: float = 0.5
    latency_messages: int = 1_000
    runs: tuple[tuple[str, int], ...] = DEFAULT_RUNS
    #: how long a batched consumer (template or reference) waits for more deliveries after
    #: a batch's first, in ms (EO_BATCH_WAIT_MS)
    batch_wait_ms: float = 0.0
    #: where the traced paths export their spans (`run_bench` starts a sink when one runs)
    otlp_endpoint: str = ""
    #: how many times slower than plain Python the consumers run (the instructions bench's
    #: run under callgrind, 20-50 times): the drain's and the latency phase's time bounds
    #: (60 s plus 50 ms a message, and twice the expected time) grow by it
    slowdown: float = 1.0
    #: the load shapes, each with every run of `runs` (default: uniform, the small balance)
    shapes: tuple[Shape, ...] = (Shape(),)


@dataclass
class RunFigures:
    """One run of one path: throughput draining the preloaded queue (messages/s, from the
    first output at the sink to the last), machine CPU per message in ms per process group
    (`python`: the consumer processes; `postgresql`, `rabbitmq`; `total`), latency in ms at
    `offered_per_s`, database round trips per message, and rows counted at rest."""

    label: str
    path: str
    processes: int
    round: int
    seconds: float
    messages_per_s: float
    cpu_ms: dict[str, float]
    offered_per_s: float
    p50_ms: float
    p99_ms: float
    round_trips_per_message: float
    dedup_rows_at_rest: int
    at_rest: dict[str, int]
    sink_duplicates: int
    #: the sender's token insert of each latency message, p50 / p99 in ms (token paths;
    #: 0.0 elsewhere): part of the latency, the protocol's cost rather than the consumer's
    sender_p50_ms: float = 0.0
    sender_p99_ms: float = 0.0
    #: the load shape's label (`Shape.label`)
    shape: str = "uniform"
    #: commits refused by a conflict (and retried) per message drained (template paths;
    #: the references lock the account's row instead: 0)
    conflicts_per_message: float = 0.0


@dataclass
class Summary:
    """A label's runs under one shape: throughput min / median / max, median CPU per group,
    latency and conflicts per message."""

    label: str
    messages_per_s: tuple[float, float, float]
    cpu_ms: dict[str, float]
    p50_ms: float
    p99_ms: float
    round_trips_per_message: float
    dedup_rows_at_rest: int
    ratios: dict[str, float] = field(default_factory=dict)
    sender_p50_ms: float = 0.0
    sender_p99_ms: float = 0.0
    shape: str = "uniform"
    conflicts_per_message: float = 0.0


@dataclass
class BenchResult:
    """The parameters, the machine (versions) and every run."""

    params: Params
    machine: dict[str, str]
    runs: list[RunFigures]

    def summaries(self) -> list[Summary]:
        """One summary per (shape, label), in the order of their first run; each with its
        median throughput over each reference's under the same shape with the same number
        of processes (`ratios`: reference -> x)."""
        keys = list(dict.fromkeys((r.shape, r.label) for r in self.runs))
        out = []
        for shape, label in keys:
            runs = [r for r in self.runs if (r.shape, r.label) == (shape, label)]
            rates = sorted(r.messages_per_s for r in runs)
            out.append(Summary(
                label, (rates[0], statistics.median(rates), rates[-1]),
                {g: statistics.median(r.cpu_ms[g] for r in runs) for g in runs[0].cpu_ms},
                statistics.median(r.p50_ms for r in runs),
                statistics.median(r.p99_ms for r in runs),
                statistics.median(r.round_trips_per_message for r in runs),
                max(r.dedup_rows_at_rest for r in runs), {},
                statistics.median(r.sender_p50_ms for r in runs),
                statistics.median(r.sender_p99_ms for r in runs), shape,
                statistics.median(r.conflicts_per_message for r in runs)))
        medians = {(s.shape, s.label): s.messages_per_s[1] for s in out}
        for s in out:
            processes = next(r.processes for r in self.runs if r.label == s.label)
            for ref in REFERENCES:
                ref_label = ref if processes == 1 else f"{ref} x{processes}"
                if medians.get((s.shape, ref_label)):
                    s.ratios[ref] = medians[(s.shape, s.label)] / medians[(s.shape, ref_label)]
        return out


def percentile_ms(values_ns: list[int], p: float) -> float:
    """The `p`-quantile (0..1, nearest rank) of `values_ns` (nanoseconds), in milliseconds."""
    ordered = sorted(values_ns)
    return ordered[max(math.ceil(p * len(ordered)) - 1, 0)] / 1e6 if ordered else 0.0


#: How each path counts its deduplication rows at rest (for the table's notes and the JSON).
DEDUP_ROWS = {
    "token": "incoming tokens left (eo_token rows of the run's message IDs)",
    "outbox": "processed-message rows, kept for the retention window",
    "state": "state stream entries, one per message until retention truncates them",
    "references": "inbox rows (bench_inbox), one per message, kept for ever",
    "dbos": "workflow rows (dbos.workflow_status, with their inputs, outputs and step "
            "checkpoints), one per message, kept until DBOS's retention deletes them",
}

#: What the latency columns measure.
LATENCY = ("producer publish (sent_at_ns in the body, before the sender's token insert) to "
           "first receipt at the sink, the producer publishing at a fixed rate: the run's "
           "drain throughput times the load ratio")


def as_json(result: BenchResult) -> dict[str, Any]:
    """Parameters, machine, every run and the summaries (ratios included). Units: seconds,
    messages/s, milliseconds (CPU: machine CPU ms per message)."""
    params = asdict(result.params)
    params.pop("database_dsn")  # may hold a password; the database name is enough
    params.pop("amqp_url")
    params.pop("otlp_endpoint")  # this run's sink, gone
    return {"parameters": params, "machine": result.machine,
            "runs": [asdict(r) for r in result.runs],
            "summaries": [asdict(s) for s in result.summaries()],
            "dedup_rows_meaning": DEDUP_ROWS, "latency_meaning": LATENCY}


def write_json(result: BenchResult, path: Path) -> None:
    """Write `as_json(result)` to `path` (parent directories created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(as_json(result), indent=2) + "\n")


def print_table(result: BenchResult, console: Console) -> None:
    """The summaries side by side, then the machine line and the notes."""
    p = result.params
    table = Table(title=f"eo bench: {p.messages:,} messages per run (fewer for a big state: "
                        f"docs/bench.md), {p.partitions:,} "
                        f"partitions, {p.rounds} round(s); in flight {p.in_flight} "
                        f"(batched: {PREFETCH_IN_BATCHES * p.batch_size}, batches of {p.batch_size}"
                        f"{f', wait {p.batch_wait_ms:g} ms' if p.batch_wait_ms else ''})")
    for column in ("shape", "path", "msg/s min", "median", "max", "CPU ms/msg", "Python", "PG",
                   "RabbitMQ", "p50 ms", "p99 ms", "trips/msg", "conflicts/msg", "dedup rows",
                   *(f"/ {ref}" for ref in REFERENCES)):
        table.add_column(column, justify="left" if column in ("shape", "path") else "right")
    for s in result.summaries():
        low, mid, high = s.messages_per_s
        table.add_row(s.shape, s.label, f"{low:,.0f}", f"{mid:,.0f}", f"{high:,.0f}",
                      f"{s.cpu_ms['total']:.2f}", f"{s.cpu_ms['python']:.2f}",
                      f"{s.cpu_ms['postgresql']:.2f}", f"{s.cpu_ms['rabbitmq']:.2f}",
                      f"{s.p50_ms:,.1f}", f"{s.p99_ms:,.1f}",
                      # DBOS's statements go through SQLAlchemy, not the counted pool
                      "-" if s.label.split()[0] == "dbos" else f"{s.round_trips_per_message:.2f}",
                      f"{s.conflicts_per_message:.3f}",
                      f"{s.dedup_rows_at_rest:,}",
                      *(f"{s.ratios[ref]:.2f}" if ref in s.ratios else "-"
                        for ref in REFERENCES))
    console.print(table, width=max(console.width, 190))
    m = result.machine
    console.print(f"machine: {m['nproc']} CPUs, Python {m['python']}, PostgreSQL "
                  f"{m['postgresql']}, RabbitMQ {m['rabbitmq']}; latency at "
                  f"{p.load_ratio:.0%} of each run's throughput")
    console.print("dedup rows: " + "; ".join(f"{k}: {v}" for k, v in DEDUP_ROWS.items()))
    console.print(f"latency: {LATENCY}")
    senders = [f"{s.label} {s.sender_p50_ms:.1f} / {s.sender_p99_ms:.1f}"
               for s in result.summaries() if s.sender_p99_ms]
    if senders:
        console.print("of which the sender's token insert, p50 / p99 ms: " + ", ".join(senders))
