"""`eo bench`: what exactly-once costs, the paths side by side on PostgreSQL and RabbitMQ."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import asyncpg
import typer
from rich.console import Console

from application.errors import TransientError
from entrypoints.settings import SettingsError, load_settings
from tools.guard import refuse_production

console = Console()
bench_app = typer.Typer(add_completion=False)


@bench_app.command()
def bench(
    messages: Annotated[int, typer.Option(min=1, help="messages per path")] = 3_000,
    partitions: Annotated[int, typer.Option(min=1, help="accounts (partitions)")] = 1_000,
    in_flight: Annotated[int, typer.Option(min=1, help="deliveries in flight (prefetch)")] = 8,
    json_path: Annotated[Path, typer.Option("--json", help="where to write the results")] = Path(
        "var/bench.json"),
    database_dsn: Annotated[str, typer.Option(help="a database of the bench's own")] = (
        "postgresql://postgres@127.0.0.1:5432/eo_bench"),
    amqp_url: Annotated[str | None, typer.Option(
        help="RabbitMQ (default: the local profile's)")] = None,
) -> None:
    """At-least-once baseline, outbox path, token path and state path side by side on
    PostgreSQL and RabbitMQ: messages/s, end-to-end latency, DB round trips per message,
    deduplication rows at rest. The bench has an endpoint of its own (tools/bench/endpoint.py)."""
    from tools.bench.report import Params, print_table, write_json
    from tools.bench.run import run_bench

    try:
        refuse_production("bench")
        url = amqp_url or load_settings(profile="local").amqp()
    except SettingsError as exc:
        Console(stderr=True).print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    params = Params(messages, partitions, in_flight, database_dsn, url)
    try:
        result = asyncio.run(run_bench(params))
    except (TransientError, OSError, asyncpg.PostgresError, RuntimeError) as exc:
        Console(stderr=True).print(f"[red]bench failed: {type(exc).__name__}: {exc}[/red]")
        raise typer.Exit(3) from exc
    print_table(result, console)
    write_json(result, json_path)
    console.print(f"results written to {json_path}")
