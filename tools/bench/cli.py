"""`eo bench`: what exactly-once costs, the paths side by side on PostgreSQL and RabbitMQ."""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import asyncpg
import typer
from rich.console import Console

from application.defaults import PREFETCH_IN_BATCHES, SINGLE_PREFETCH
from application.errors import TransientError
from entrypoints.settings import SettingsError, load_settings
from tools.bench.shapes import Shape, parse
from tools.guard import refuse_production

console = Console()
T = TypeVar("T")
bench_app = typer.Typer(add_completion=False)


def _runs(spec: str) -> tuple[tuple[str, int], ...]:
    """`path[xN],...` (N consumer processes, default 1) as (path, processes) pairs; raises
    `typer.BadParameter` naming a bad item."""
    from tools.bench.run import PATHS

    runs = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        match = re.fullmatch(r"(?P<path>[a-z-]+?)(?:x(?P<n>\d+))?", item)
        if match is None or match["path"] not in PATHS or int(match["n"] or 1) < 1:
            raise typer.BadParameter(f"{item!r}: expected one of {', '.join(PATHS)}, "
                                     "optionally followed by xN (N consumer processes)")
        runs.append((match["path"], int(match["n"] or 1)))
    return tuple(runs)


async def _until_terminated(work: Coroutine[Any, Any, T]) -> T:
    """Await `work`, cancelled by SIGTERM as Ctrl-C cancels `asyncio.run`'s task, so that
    its clean-ups run either way (the bench's database, virtual host, queues and consumer
    processes removed: `timeout`, a CI runner or `kill` stop it with SIGTERM, which would
    otherwise end the process where it stands). Raises CancelledError after a SIGTERM."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _shapes(spec: str) -> tuple[Shape, ...]:
    """The load shapes of `--shapes` (tools/bench/shapes.py); raises `typer.BadParameter`
    naming a bad one."""
    try:
        found = tuple(parse(item) for item in spec.split(",") if item.strip())
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--shapes") from exc
    if not found:
        raise typer.BadParameter("no shape given", param_hint="--shapes")
    return found


@bench_app.command()
def bench(
    messages: Annotated[int, typer.Option(min=2, help="messages per run")] = 10_000,
    partitions: Annotated[int, typer.Option(min=1, help="accounts (partitions)")] = 1_000,
    in_flight: Annotated[int, typer.Option(
        min=1, help="deliveries in flight per unbatched consumer")] = SINGLE_PREFETCH,
    batch_size: Annotated[int, typer.Option(
        min=2, help=f"deliveries per batch (batched paths: {PREFETCH_IN_BATCHES} x this in "
                    "flight)")] = 50,
    batch_wait_ms: Annotated[float, typer.Option(
        min=0, help="how long a batch waits to fill after its first delivery, both batched "
                    "consumers (EO_BATCH_WAIT_MS)")] = 0.0,
    rounds: Annotated[int, typer.Option(min=1, help="interleaved rounds (min/median/max)")] = 1,
    runs: Annotated[str | None, typer.Option(
        help="comma-separated path[xN] (N consumer processes); default: every path, and "
             "token-batched and minimal-batched on 2 processes")] = None,
    load_ratio: Annotated[float, typer.Option(
        min=0.05, max=1.0, help="latency's offered load, as a share of the throughput")] = 0.5,
    json_path: Annotated[Path, typer.Option("--json", help="where to write the results")] = Path(
        "var/bench.json"),
    database_dsn: Annotated[str, typer.Option(
        help="the server of the bench's own database, created as <name>_<pid>_<hex> (<name>: "
             "the database this names, never touched) and dropped at the end")] = (
        "postgresql://postgres@127.0.0.1:5432/eo_bench"),
    amqp_url: Annotated[str | None, typer.Option(
        help="RabbitMQ (default: the local profile's)")] = None,
    shapes: Annotated[str, typer.Option(
        help="comma-separated load shapes, each with every run: uniform, zipf:<s> or one "
             "(how deposits fall on the accounts), optionally @<state size> (1k, 64k, 512k: "
             "each account's state; a big one drains fewer messages); docs/bench.md")] = (
        "uniform"),
) -> None:
    """The template's paths (token, token-batched, outbox, state) beside two references
    with an inbox table and an outbox (a minimal aio-pika + asyncpg consumer, per message and
    batched; FastStream), on PostgreSQL and RabbitMQ. Each consumer runs in processes of its
    own and drains a preloaded queue: messages/s, machine CPU per message per process group
    (Python, PostgreSQL, RabbitMQ), latency at a fixed offered load, each path's ratio to
    the references, deduplication rows at rest (docs/bench.md). It works on a database, a
    virtual host (when this host administers the broker) and queues of its own, removed at
    the end."""
    from tools.bench.report import DEFAULT_RUNS, Params, print_table, write_json
    from tools.bench.run import run_bench

    try:
        refuse_production("bench")
        url = amqp_url or load_settings(profile="local").amqp()
    except SettingsError as exc:
        Console(stderr=True).print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    params = Params(messages, partitions, in_flight, batch_size, database_dsn, url,
                    rounds=rounds, load_ratio=load_ratio, batch_wait_ms=batch_wait_ms,
                    runs=_runs(runs) if runs else DEFAULT_RUNS, shapes=_shapes(shapes))

    def progress(run: object) -> None:
        r: Any = run
        console.print(f"round {r.round}: {r.shape:<14} {r.label:<20} "
                      f"{r.messages_per_s:8,.0f} msg/s  "
                      f"CPU {r.cpu_ms['total']:.2f} ms/msg  p50 {r.p50_ms:,.1f} ms")

    try:
        result = asyncio.run(_until_terminated(run_bench(params, progress)))
    except asyncio.CancelledError as exc:  # SIGTERM: what the bench made is removed already
        Console(stderr=True).print("[red]bench stopped by SIGTERM: its database, virtual host "
                                   "and consumer processes removed[/red]")
        raise typer.Exit(128 + signal.SIGTERM) from exc
    except (TransientError, OSError, asyncpg.PostgresError, RuntimeError) as exc:
        Console(stderr=True).print(f"[red]bench failed: {type(exc).__name__}: {exc}[/red]")
        raise typer.Exit(3) from exc
    print_table(result, console)
    write_json(result, json_path)
    console.print(f"results written to {json_path}")
