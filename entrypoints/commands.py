"""What every `eo` command does, shared by the command modules (entrypoints/cli.py,
entrypoints/dead_letter_cli.py) without importing each other: fail with a message and an
exit code, load the settings and the service they name, run a service process with its exit
codes. Imports stay light at module level (`eo --help` imports this)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from entrypoints.settings import Service, Settings


def fail(message: str, code: int) -> typer.Exit:
    """Print `message` in red on stderr; the `typer.Exit(code)` to raise."""
    from rich.console import Console

    Console(stderr=True).print(f"[red]{message}[/red]", highlight=False)
    return typer.Exit(code)


def load(profile: str | None = None, services: bool = False, **overrides: object
         ) -> tuple[Settings, Service]:
    """Settings (with `profile` and `overrides`) and the service they name; with `services`,
    the `embedded` profile becomes `local` (commands that need PostgreSQL and RabbitMQ).
    Exits 2 naming the variable when a setting or the registry is invalid."""
    from entrypoints.settings import SettingsError, load_settings, resolve_service

    if profile is not None:
        overrides["profile"] = profile
    try:
        settings = load_settings(**overrides)
        if services and settings.profile == "embedded":
            settings = load_settings(**{**overrides, "profile": "local"})
        return settings, resolve_service(settings)
    except SettingsError as exc:
        raise fail(str(exc), 2) from exc


def run_service(coro: Coroutine[Any, Any, None]) -> None:
    """Run a service process; exit 69 when a server stayed away for `EO_BROKER_GIVE_UP_S`
    (the broker of a running consumer; PostgreSQL or RabbitMQ at start-up), 2 for a bad
    setting, 3 when start-up finds what no wait fixes (a missing database or schema,
    refused credentials)."""
    from adapters.rabbitmq.errors import BrokerUnavailable
    from application.errors import PermanentError, TransientError
    from entrypoints.service import EXIT_BROKER_UNAVAILABLE
    from entrypoints.settings import SettingsError
    from entrypoints.startup import GaveUpWaiting

    try:
        asyncio.run(coro)
    except BrokerUnavailable as exc:  # after start: the orchestrator should restart us
        raise fail(f"broker unavailable, exiting: {exc}", EXIT_BROKER_UNAVAILABLE) from exc
    except GaveUpWaiting as exc:  # a server away, not a fault of ours: restart us too
        raise fail(f"gave up waiting at start-up, exiting: {exc}",
                   EXIT_BROKER_UNAVAILABLE) from exc
    except SettingsError as exc:
        raise fail(str(exc), 2) from exc
    except (TransientError, PermanentError) as exc:
        raise fail(f"cannot start: {exc}", 3) from exc
