"""`eo dead-letters`: list, show, replay and discard the service's dead letters, or serve them
over HTTP (entrypoints/dead_letter_api.py). Imports stay inside the commands (`eo --help`
stays fast)."""

from __future__ import annotations

import asyncio
import getpass
import json
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    from application.dead_letters import DeadLetters
    from application.ports import DeadLetterQuery
    from application.records import DeadLetter
    from entrypoints.local import LocalContainer
    from entrypoints.service_spec import Service
    from entrypoints.settings import Settings

T = TypeVar("T")

dead_letters_app = typer.Typer(
    no_args_is_help=True, add_completion=False, rich_markup_mode=None,
    help="The service's dead letters (PostgreSQL and RabbitMQ of EO_PROFILE local or "
         "production): list, show, replay, discard, or serve them over HTTP.")

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str | None, option: str | None = None) -> timedelta | None:
    """`30s`, `15m`, `2h` or `7d` as a timedelta (None for None), at most 100 years
    (`MAX_AGE_S` of entrypoints/dead_letter_api.py); raises `typer.BadParameter` naming
    `option` otherwise."""
    from entrypoints.dead_letter_views import age

    if text is None:
        return None
    match = _DURATION.match(text.strip())
    if match is None:
        raise typer.BadParameter(f"{text!r} is not a duration such as 30s, 15m, 2h or 7d",
                                 param_hint=option)
    try:
        return age(float(match.group(1)) * _UNITS[match.group(2)], "a duration")
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from exc


def _check_ids(ids: list[int], argument: str) -> None:
    """Raises `typer.BadParameter` naming `argument` unless each of `ids` is a dead-letter
    ID (1..2**63 - 1, PostgreSQL's bigint)."""
    from entrypoints.dead_letter_views import MAX_DEAD_LETTER_ID

    if not all(1 <= i <= MAX_DEAD_LETTER_ID for i in ids):
        raise typer.BadParameter(f"dead-letter IDs are 1..{MAX_DEAD_LETTER_ID}",
                                 param_hint=argument)


def operator_name() -> str:
    """Who acts from this shell: `<user>@<host>` (what the log records with each action)."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


_ENDPOINT = Annotated[list[str] | None, typer.Option(
    "--endpoint", help="only this endpoint's (repeat for several)")]
_REASON = Annotated[str | None, typer.Option(help="only those whose latest reason contains "
                                                  "this text (case apart)")]
_OLDER = Annotated[str | None, typer.Option(help="only those dead-lettered longer ago (30m, "
                                                 "2h, 7d)")]
_NEWER = Annotated[str | None, typer.Option(help="only those dead-lettered within (30m, 2h)")]
_LIMIT = Annotated[int, typer.Option(help="at most this many, oldest first")]
_BY = Annotated[str | None, typer.Option(help="who acts (default: <user>@<host>)")]
_ALL = Annotated[bool, typer.Option("--all", help="act on every dead letter the filters "
                                                  "select (needed without IDs)")]
_FORMAT = Annotated[str, typer.Option("--format", help="text or json")]
_PROFILE = Annotated[str | None, typer.Option(
    help="local or production (default: EO_PROFILE; embedded means local here)")]


@asynccontextmanager
async def _container(settings: Settings, service: Service) -> AsyncIterator[LocalContainer]:
    """The composition root of the services of `settings` for an operator's command: its
    resources start as the command's providers need them, and are closed at the end."""
    from entrypoints.local import LocalContainer
    from entrypoints.resources import shutdown_resources

    container = LocalContainer(settings=settings, service=service)
    container.connection_name.override(f"eo dead-letters {operator_name()}")
    try:
        yield container
    finally:
        await shutdown_resources(container)


def _run(profile: str | None, work: Callable[[LocalContainer], Awaitable[T]]) -> T:
    """`work` on the composition root of the configured service; exits 3 with the reason
    when PostgreSQL or RabbitMQ does not answer or refuses (no such database, refused
    credentials)."""
    from application.errors import PermanentError, TransientError
    from entrypoints.commands import fail, load

    settings, service = load(profile, services=True)

    async def main() -> T:
        async with _container(settings, service) as container:
            return await work(container)

    try:
        return asyncio.run(main())
    except (TransientError, PermanentError) as exc:
        raise fail(f"dead letters: {exc}", 3) from exc


def _read(profile: str | None, query: DeadLetterQuery) -> list[DeadLetter]:
    """The dead letters `query` selects, read with one connection to the endpoint database
    and nothing else (no composition root: no broker, no blob store); exits 3 with the
    reason when PostgreSQL does not answer, has no such database or refuses the
    credentials."""
    from adapters.system.clock import SystemClock
    from application.errors import PermanentError, TransientError
    from entrypoints.commands import fail, load
    from entrypoints.pools import dead_letter_store_of, endpoint_pool

    settings, _ = load(profile, services=True)

    async def main() -> list[DeadLetter]:
        async with endpoint_pool(settings) as pool:
            return await dead_letter_store_of(pool, SystemClock()).find(query)

    try:
        return asyncio.run(main())
    except (TransientError, PermanentError) as exc:
        raise fail(f"dead letters: {exc}", 3) from exc


async def _operations(container: LocalContainer) -> DeadLetters:
    """The operations on the dead letters (they republish and release: every adapter)."""
    from entrypoints.resources import provided

    return await provided(container.dead_letter_operations)


def _query(endpoint: list[str] | None, ids: list[int] | None, status: str | None,
           reason: str | None, older_than: str | None, newer_than: str | None,
           limit: int) -> Any:
    from entrypoints.dead_letter_views import query_of

    try:
        return query_of(endpoint, ids, status, reason, duration(older_than, "--older-than"),
                        duration(newer_than, "--newer-than"), limit)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


@dead_letters_app.command(name="list")
def list_command(endpoint: _ENDPOINT = None, reason: _REASON = None, older_than: _OLDER = None,
                 newer_than: _NEWER = None,
                 status: Annotated[str, typer.Option(
                     help="dead (waiting for an operator), replayed, discarded or any")] = "dead",
                 limit: _LIMIT = 100, output: _FORMAT = "text",
                 profile: _PROFILE = None) -> None:
    """List dead letters, oldest first: ID, endpoint, age, reason, message and origin."""
    from entrypoints.dead_letter_views import letter_json
    from entrypoints.report import print_dead_letters

    query = _query(endpoint, None, status, reason, older_than, newer_than, limit)
    found = _read(profile, query)
    if output == "json":
        typer.echo(json.dumps([letter_json(d) for d in found], indent=2))
    else:
        print_dead_letters(found)


@dead_letters_app.command()
def show(dead_letter_id: Annotated[int, typer.Argument(help="the dead letter's ID")],
         output: _FORMAT = "text", profile: _PROFILE = None) -> None:
    """One dead letter whole: its reason history, origin, what operators did, whether its
    token still exists, its headers and body."""
    from application.ports import DeadLetterQuery
    from entrypoints.commands import fail
    from entrypoints.dead_letter_views import letter_json
    from entrypoints.report import print_dead_letter

    _check_ids([dead_letter_id], "DEAD_LETTER_ID")

    async def look(container: LocalContainer) -> tuple[Any, bool | None] | None:
        ops = await _operations(container)
        found = await ops.find(DeadLetterQuery(ids=(dead_letter_id,), status=None, limit=1))
        return (found[0], await ops.token_exists(found[0])) if found else None

    shown = _run(profile, look)
    if shown is None:
        raise fail(f"no dead letter {dead_letter_id}", 1)
    if output == "json":
        typer.echo(json.dumps(letter_json(*shown), indent=2))
    else:
        print_dead_letter(*shown)


def _act(ids: list[int] | None, select_all: bool, endpoint: list[str] | None,
         reason: str | None, older_than: str | None, newer_than: str | None, limit: int,
         profile: str | None, single: Callable[[DeadLetters, int], Awaitable[Any]],
         many: Callable[[DeadLetters, Any], Awaitable[list[Any]]]) -> None:
    from entrypoints.report import print_results

    filtered = any((endpoint, reason, older_than, newer_than))
    if ids and (select_all or filtered):
        raise typer.BadParameter("name dead letters by ID, or select them with filters and "
                                 "--all, not both")
    if not ids and not select_all:
        raise typer.BadParameter("name dead letters by ID, or select them with filters and "
                                 "--all")
    _check_ids(ids or [], "IDS")
    if ids:
        results = _run(profile, lambda c: _each(c, ids, single))
    else:
        query = _query(endpoint, None, "dead", reason, older_than, newer_than, limit)
        results = _run(profile, lambda c: _many(c, query, many))
    print_results(results)
    if not all(r.done for r in results):
        raise typer.Exit(1)


async def _each(container: LocalContainer, ids: list[int],
                single: Callable[[DeadLetters, int], Awaitable[Any]]) -> list[Any]:
    ops = await _operations(container)
    return [await single(ops, i) for i in ids]


async def _many(container: LocalContainer, query: Any,
                many: Callable[[DeadLetters, Any], Awaitable[list[Any]]]) -> list[Any]:
    return await many(await _operations(container), query)


@dead_letters_app.command()
def replay(ids: Annotated[list[int] | None, typer.Argument(help="dead letter IDs")] = None,
           select_all: _ALL = False, endpoint: _ENDPOINT = None, reason: _REASON = None,
           older_than: _OLDER = None, newer_than: _NEWER = None, limit: _LIMIT = 100,
           by: _BY = None, profile: _PROFILE = None) -> None:
    """Republish dead letters to their endpoints under their message IDs, once their cause
    is fixed: processed once while their tokens exist, dropped as duplicates otherwise.
    Exits 1 when one was refused (the reason is printed)."""
    who = by or operator_name()
    _act(ids, select_all, endpoint, reason, older_than, newer_than, limit, profile,
         lambda ops, i: ops.replay(i, who), lambda ops, q: ops.replay_many(q, who))


@dead_letters_app.command()
def discard(ids: Annotated[list[int] | None, typer.Argument(help="dead letter IDs")] = None,
            why: Annotated[str, typer.Option(help="why (logged with who discarded it; at most "
                                                 "1,000 characters)")] = "",
            select_all: _ALL = False, endpoint: _ENDPOINT = None, reason: _REASON = None,
            older_than: _OLDER = None, newer_than: _NEWER = None, limit: _LIMIT = 100,
            by: _BY = None, profile: _PROFILE = None) -> None:
    """Discard dead letters for good: their tokens, their attempts' registrations and a
    follow-up's stored request are deleted, so nothing is left at rest. Exits 1 when one
    was refused (e.g. its transaction is committed: it was processed); exits 2 when --why
    is blank or over 1,000 characters."""
    from application.dead_letters import check_why

    if not why.strip():
        raise typer.BadParameter("say why (it is logged with who discarded it)",
                                 param_hint="--why")
    try:
        check_why(why)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--why") from exc
    who = by or operator_name()
    _act(ids, select_all, endpoint, reason, older_than, newer_than, limit, profile,
         lambda ops, i: ops.discard(i, who, why),
         lambda ops, q: ops.discard_many(q, who, why))


@dead_letters_app.command()
def serve(profile: _PROFILE = None) -> None:
    """Serve the dead letters over HTTP (list, show, replay, discard; OpenAPI at
    /openapi.json) on EO_OPERATOR_HOST:EO_OPERATOR_PORT (port 0: a free one, printed),
    each request, the OpenAPI document's too, authenticated by an operator's bearer token
    (EO_OPERATOR_TOKENS='{"alice": "<token>"}'), until SIGTERM."""
    from entrypoints.commands import fail, load, run_service

    settings, service = load(profile, services=True)
    if not settings.operator.operator_tokens:
        raise fail("invalid setting EO_OPERATOR_TOKENS: required to serve the dead letters "
                   "(operator name -> bearer token, e.g. '{\"alice\": \"...\"}')", 2)
    from entrypoints.operator_servers import run_dead_letter_api

    run_service(run_dead_letter_api(settings, service))
