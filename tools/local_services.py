"""`eo local-services up|status|down`: the local profile's shared services on a laptop.

The local profile's processes share PostgreSQL and RabbitMQ, which run as services of the
machine; its S3 API, when `EO_S3_ENDPOINT_URL` is unset, is a moto server each process starts
for itself and loses when it exits, so competing consumers of one endpoint write their blobs
to different servers. `up` starts what is missing of the shared set: an S3 API (a moto server
in a process of its own, on a free port of 127.0.0.1, kept in memory while it runs) unless
`EO_S3_ENDPOINT_URL` already answers; it says on stderr whether PostgreSQL and RabbitMQ (of
`EO_DATABASE_DSN` / `EO_AMQP_URL`, or their defaults) answer, which it cannot start, and
prints on stdout the settings to export, so `eval "$(./dev local-services up)"` configures a
shell. A second `up` finds the running server (its state file) and prints the same. `down`
stops the server it started; `status` prints what runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import typer

local_services_app = typer.Typer(add_completion=False, no_args_is_help=True,
                                 help=__doc__.splitlines()[0] if __doc__ else None)

#: where `up` records the S3 server it started (pid, URL), relative to the working directory
DEFAULT_STATE = Path("var/local-services.json")
#: the credentials the local S3 API takes (moto takes any non-empty ones)
ACCESS_KEY = SECRET_KEY = "local"
START_TIMEOUT_S = 30.0

_STATE = Annotated[Path, typer.Option(help="the state file of the S3 server `up` starts")]


def _answers(url: str, timeout_s: float = 2.0) -> bool:
    """Whether an HTTP server answers at `url` (any status: an S3 API refuses anonymous
    requests with 403)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, not ours
        return True
    return True


def running(state: Path) -> dict[str, Any] | None:
    """The S3 server of `state` ({"pid", "url"}) when its process lives and answers; None
    otherwise (a stale state file is removed)."""
    try:
        found = json.loads(state.read_text())
    except (OSError, ValueError):
        return None
    if _alive(int(found["pid"])) and _answers(str(found["url"])):
        return dict(found)
    state.unlink(missing_ok=True)
    return None


def exports(url: str) -> str:
    """The shell lines that point the local profile's processes at the S3 API `url`."""
    return "\n".join([f"export EO_S3_ENDPOINT_URL={url}", f"export EO_S3_ACCESS_KEY={ACCESS_KEY}",
                      f"export EO_S3_SECRET_KEY={SECRET_KEY}"])


def _report_servers() -> None:
    """Say on stderr whether PostgreSQL and RabbitMQ of the settings answer."""
    import aio_pika
    import asyncpg

    from entrypoints.settings import load_settings

    settings = load_settings(profile="local")

    async def check() -> list[str]:
        lines = []
        try:
            conn = await asyncpg.connect(settings.database(), timeout=5)
            await conn.close()
            lines.append("PostgreSQL answers (EO_DATABASE_DSN)")
        except asyncpg.InvalidCatalogNameError:
            lines.append("PostgreSQL answers; its database does not exist yet: `./dev "
                         "migrate` creates it (EO_DATABASE_DSN)")
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            lines.append(f"PostgreSQL does not answer ({type(exc).__name__}): start it, e.g. "
                         "`pg_ctlcluster <version> main start`, or set EO_DATABASE_DSN")
        try:
            connection = await aio_pika.connect(settings.amqp(), timeout=5)
            await connection.close()
            lines.append("RabbitMQ answers (EO_AMQP_URL)")
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            lines.append(f"RabbitMQ does not answer ({type(exc).__name__}): start it, e.g. "
                         "`rabbitmq-server -detached`, or set EO_AMQP_URL")
        return lines

    for line in asyncio.run(check()):
        typer.echo(line, err=True)


@local_services_app.command()
def up(state: _STATE = DEFAULT_STATE) -> None:
    """Start the shared services that are not running (an S3 API), then print the settings
    to export. Exits 1 when the S3 server does not start within 30 s."""
    _report_servers()
    own = os.environ.get("EO_S3_ENDPOINT_URL")
    if own and _answers(own):
        typer.echo(f"S3 API answers at EO_S3_ENDPOINT_URL={own}: nothing to start", err=True)
        typer.echo(exports(own))
        return
    found = running(state)
    if found is None:
        state.parent.mkdir(parents=True, exist_ok=True)
        log = state.with_suffix(".log")
        with log.open("ab") as out:
            subprocess.Popen(  # this interpreter, this module
                [sys.executable, "-m", "tools.local_services", "--serve", str(state)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)  # it outlives this command and its terminal
        deadline = time.monotonic() + START_TIMEOUT_S
        while (found := running(state)) is None:
            if time.monotonic() > deadline:
                typer.echo(f"the S3 server did not start within {START_TIMEOUT_S:.0f} s: see "
                           f"{log}", err=True)
                raise typer.Exit(1)
            time.sleep(0.1)
        typer.echo(f"S3 API (moto) started at {found['url']}, pid {found['pid']}", err=True)
    else:
        typer.echo(f"S3 API (moto) already running at {found['url']}, pid {found['pid']}",
                   err=True)
    typer.echo(exports(str(found["url"])))


@local_services_app.command()
def status(state: _STATE = DEFAULT_STATE) -> None:
    """Print what runs; exits 1 when no S3 server of `up` runs."""
    _report_servers()
    found = running(state)
    if found is None:
        typer.echo("no S3 API started by `eo local-services up`", err=True)
        raise typer.Exit(1)
    typer.echo(f"S3 API (moto) at {found['url']}, pid {found['pid']}", err=True)
    typer.echo(exports(str(found["url"])))


@local_services_app.command()
def down(state: _STATE = DEFAULT_STATE) -> None:
    """Stop the S3 server `up` started (its blobs are lost: they lived in its memory)."""
    found = running(state)
    if found is None:
        typer.echo("no S3 API started by `eo local-services up` runs", err=True)
        return
    pid = int(found["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    state.unlink(missing_ok=True)
    typer.echo(f"stopped the S3 API at {found['url']} (pid {pid})", err=True)


def serve(state: Path) -> None:
    """The S3 server's process: moto on a free port of 127.0.0.1, its pid and URL written to
    `state` once it answers, until SIGTERM or SIGINT."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    written = state.with_suffix(".tmp")
    written.write_text(json.dumps({"pid": os.getpid(), "url": f"http://{host}:{port}"}))
    written.replace(state)  # whole or absent: `up` polls it
    try:
        while not stop.wait(0.5):
            pass
    finally:
        with contextlib.suppress(Exception):
            server.stop()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(Path(sys.argv[2]))
    else:
        sys.exit("usage: python -m tools.local_services --serve STATE (started by `eo "
                 "local-services up`)")
