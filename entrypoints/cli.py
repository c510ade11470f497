"""The `eo` command line. Imports stay light at module level (`eo consume --help` starts in a
fraction of a second): each command imports what it runs, and the tools (`demo`, `chaos`,
`bench`, `pipeline`) are loaded only when invoked, from the `tools` package when present."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from entrypoints.commands import fail, load, run_service
from entrypoints.tool_commands import WithTools

app = typer.Typer(cls=WithTools, no_args_is_help=True, add_completion=False,
                  rich_markup_mode=None,
                  help="Exactly-once service template: run your service's endpoints, "
                       "operate them, and (where installed) the tools.")

_PROFILE = Annotated[str | None, typer.Option(
    help="local or production (default: EO_PROFILE; embedded means local here)")]
_ENDPOINT = Annotated[str, typer.Option(help="the endpoint's name (see `eo endpoints`)")]


def _add_dead_letters() -> None:
    from entrypoints.dead_letter_cli import dead_letters_app

    app.add_typer(dead_letters_app, name="dead-letters")


_add_dead_letters()


def _version(shown: bool) -> None:
    if shown:
        from entrypoints.version import banner

        typer.echo(banner())
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_version,
        help="print the service's version and the template's release it carries, and exit")
        ] = False) -> None:
    """Exactly-once service template: run your service's endpoints, operate them, and (where
    installed) the tools."""


@app.command()
def consume(endpoint: _ENDPOINT, profile: _PROFILE = None) -> None:
    """Run one endpoint's consumer (a consumer or a gateway) on RabbitMQ and PostgreSQL: the
    service's main process, with its sweeper and its status port (/metrics, /ready). Run
    several for competing consumers. SIGTERM stops it gracefully."""
    settings, service = load(profile, services=True)
    if endpoint not in service.registry:
        raise fail(f"no endpoint {endpoint!r}; the service has {service.registry.names()}", 2)
    from entrypoints.service import run_consumer

    run_service(run_consumer(settings, service, endpoint))


@app.command()
def serve(endpoint: _ENDPOINT, profile: _PROFILE = None) -> None:
    """Serve an HTTP callee endpoint (protocol 6: PUT/POST/GET/DELETE /requests/{id}, bearer
    token `EO_CALLEES__<NAME>__TOKEN`, OpenAPI at /openapi.json) with uvicorn."""
    settings, service = load(profile, services=True)
    if endpoint not in service.registry:
        raise fail(f"no endpoint {endpoint!r}; the service has {service.registry.names()}", 2)
    from entrypoints.service import run_callee

    run_service(run_callee(settings, service, endpoint))


@app.command()
def operator(profile: _PROFILE = None) -> None:
    """Serve the operator's page (per endpoint: queues, unfinished transactions, deferred
    clean-ups, dead letters, event rates; the dead letters with replay and discard) and its
    API on EO_OPERATOR_HOST:EO_OPERATOR_PORT (port 0: a free one, printed), behind the bearer
    tokens of EO_OPERATOR_TOKENS, until SIGTERM."""
    settings, service = load(profile, services=True)
    if not settings.operator.operator_tokens:
        raise fail("invalid setting EO_OPERATOR_TOKENS: required to serve the operator page "
                   "(operator name -> bearer token, e.g. '{\"alice\": \"...\"}')", 2)
    from entrypoints.operator_servers import run_operator

    run_service(run_operator(settings, service))


@app.command()
def embedded(
    messages: Annotated[str, typer.Argument(
        help="a JSON-lines file of messages, or - for standard input")] = "-",
    output: Annotated[str, typer.Option("--format", help="json or text")] = "text",
    blob_dir: Annotated[Path | None, typer.Option(
        help="where blobs go, kept after the run (default: a temporary directory, removed "
             "at the end)")] = None,
) -> None:
    """Run every endpoint of the service in this process on the memory adapters, feed them
    the messages (outside producers' format: one JSON object per line with queue,
    message_id, type, body), and print the states, the messages sent, the dead letters and
    what is left at rest. Exits 1 when a message was dead-lettered or rejected."""
    import tempfile

    from entrypoints.run_embedded import run_embedded

    if output not in ("json", "text"):
        raise typer.BadParameter("json or text", param_hint="--format")
    if messages == "-":
        lines = sys.stdin.read().splitlines()
    else:
        try:
            lines = Path(messages).read_text().splitlines()
        except OSError as exc:
            raise fail(f"cannot read {messages}: {exc}", 2) from exc
    # the blobs of a run nobody asked to keep go with it, whatever ends it
    with contextlib.ExitStack() as scratch:
        blobs = blob_dir or Path(scratch.enter_context(
            tempfile.TemporaryDirectory(prefix="eo-embedded-blobs-")))
        settings, service = load("embedded", blob_dir=blobs)
        report = asyncio.run(run_embedded(settings, service, lines))
    if output == "json":
        typer.echo(json.dumps(report.as_json(), indent=2, default=str))
    else:
        from entrypoints.report import print_embedded

        print_embedded(report)
    if report.rejected or any(report.dead_letters.values()):
        raise typer.Exit(1)


@app.command()
def endpoints(profile: _PROFILE = None) -> None:
    """List the service's endpoints: role, strategy (with EO_STRATEGIES applied), queues,
    what each uses."""
    from entrypoints.report import print_endpoints

    _, service = load(profile)
    print_endpoints(service)


@app.command()
def migrate(profile: _PROFILE = None) -> None:
    """Create the databases if missing and apply the schema migrations (alembic); says, per
    database, the revision it was at, the one it is at now and each revision applied."""
    import asyncpg

    from entrypoints.operations import migrate_reporting

    settings, _ = load(profile, services=True)
    try:
        done = asyncio.run(migrate_reporting(settings))
    except (OSError, asyncpg.PostgresError) as exc:
        raise fail(f"migration failed: {type(exc).__name__}: {exc}", 3) from exc
    for name, created, upgrade in done:
        if created:
            typer.echo(f"created database {name}")
        typer.echo(upgrade.line(name))


@app.command(name="inspect")
def inspect_command(profile: _PROFILE = None) -> None:
    """Tokens in flight, unfinished transaction records, deferred clean-ups, dead letters."""
    import aio_pika
    import asyncpg

    from entrypoints.operations import inspect
    from entrypoints.report import print_inspection

    settings, service = load(profile, services=True)
    try:
        found = asyncio.run(inspect(settings, service))
    except (OSError, asyncpg.PostgresError, aio_pika.exceptions.AMQPError) as exc:
        raise fail(f"inspection failed: {type(exc).__name__}: {exc}", 3) from exc
    print_inspection(service, found)


@app.command(name="states")
def states_command(
    endpoint: Annotated[str, typer.Argument(help="the endpoint (see `eo endpoints`)")],
    partition: Annotated[str | None, typer.Option(
        help="this partition only (its key)")] = None,
    limit: Annotated[int, typer.Option(
        min=1, max=1000, help="at most this many partitions, the first by key")] = 20,
    output: Annotated[str, typer.Option("--format", help="table or json")] = "table",
    profile: _PROFILE = None,
) -> None:
    """Print an endpoint's business states on PostgreSQL, read through its store (its
    transaction records, or its stream's newest entries on the `state` strategy): the first
    --limit partitions by key, or one --partition. Read-only. Exits 2 for an unknown
    endpoint or option, 3 when the database cannot be read."""
    import asyncpg

    from application.errors import MalformedMessage, TransientError
    from entrypoints.states import read_states

    if output not in ("table", "json"):
        raise typer.BadParameter("table or json", param_hint="--format")
    settings, service = load(profile, services=True)
    if endpoint not in service.registry:
        raise fail(f"no endpoint {endpoint!r}; the service has {service.registry.names()}", 2)
    try:
        page = asyncio.run(read_states(settings, service, endpoint, limit, partition))
    except asyncpg.UndefinedTableError as exc:
        raise fail("reading states failed: the database has no eo_* tables: run `eo "
                   "migrate`", 3) from exc
    except (OSError, asyncpg.PostgresError, TransientError) as exc:
        raise fail(f"reading states failed: {type(exc).__name__}: {exc}", 3) from exc
    except MalformedMessage as exc:
        raise fail(f"a state of {endpoint} does not decode as "
                   f"{service.registry[endpoint].endpoint.state_type.__name__}: {exc}", 3
                   ) from exc
    if output == "json":
        typer.echo(json.dumps(page.as_json(), indent=2))
    else:
        from entrypoints.report import print_states

        print_states(page)


@app.command()
def failpoints(
    spec: Annotated[str | None, typer.Argument(help="an EO_FAILPOINTS value to check")] = None,
) -> None:
    """List the failpoint names (protocol 10), or check an EO_FAILPOINTS value."""
    from application.failpoints import NAMES, PREFIXES, parse

    if spec is not None:
        try:
            rules = parse(spec)
        except ValueError as exc:
            raise fail(str(exc), 2) from exc
        for rule in rules.values():
            when = {"@": f"on hit {rule.n}", "*": f"on the first {rule.n} hits"}
            typer.echo(f"{rule.name}: {rule.action} {when.get(rule.mode or '', 'always')}")
        return
    for name in sorted(NAMES):
        typer.echo(name)
    for prefix in PREFIXES:
        typer.echo(f"{prefix}<{'k' if 'publish' in prefix else 'kind'}>")


@app.command(name="settings")
def settings_command() -> None:
    """Print the effective settings (from EO_* variables; secrets hidden) and exit 2 if one
    is invalid."""
    settings, _ = load()
    for name, value in settings.variables().items():
        typer.echo(f"{name}={json.dumps(value) if isinstance(value, dict) else value}")


def main() -> None:
    """Console-script entry point."""
    app(prog_name="eo")


if __name__ == "__main__":
    main()
