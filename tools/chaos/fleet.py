"""The service as processes for the tools (`eo chaos`, the local demo): `Fleet` starts,
kills and restarts `eo consume` / `eo serve` processes of any registry with their logs on
disk, and the helpers read what they left (states, bucket) and sweep once at the end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import httpx
from pydantic import SecretStr

from adapters.s3.blob_store import S3BlobStore, ensure_bucket, s3_client_resource
from adapters.system.clock import OffsetClock, SystemClock
from application.registry import Role
from entrypoints.local import LocalContainer, dead_letter_collector, postgres_inspection
from entrypoints.logs import configure_logging
from entrypoints.named_settings import CalleeSettings
from entrypoints.resources import provided
from entrypoints.service_spec import Service, resolve_service
from entrypoints.settings import Settings
from tools.zygote import Zygote, ZygoteProcess

S = TypeVar("S", bound=Settings)


def _secret(value: SecretStr | None) -> str:
    return value.get_secret_value() if value is not None else ""


def bucket_client(settings: Settings) -> AbstractAsyncContextManager[Any]:
    """An S3 client of the run's endpoint and credentials (settings'), for its bucket."""
    blobs = settings.blobs
    return s3_client_resource(blobs.s3_endpoint_url, blobs.s3_region,
                              _secret(blobs.s3_access_key), _secret(blobs.s3_secret_key))


async def empty_bucket(settings: Settings) -> None:
    """Create the run's bucket when missing, and delete every object in it: the oracle wants
    one invoice per order and no other object."""
    async with bucket_client(settings) as client:
        await ensure_bucket(client, settings.bucket())
        blobs = S3BlobStore(client, settings.bucket())
        for key in await blobs.keys():
            await blobs.delete(key)


def serving_url(log: Path) -> str | None:
    """The URL a callee process logged in `callee.serving`, or None (not yet)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if '"callee.serving"' in line:
            with contextlib.suppress(ValueError):
                return str(json.loads(line)["url"])
    return None


class Fleet:
    """The service's processes (`eo consume --endpoint X`, `eo serve --endpoint <callee>`),
    their logs, kill and restart. A callee starts on a free port it reports
    (`wait_for_callee` reads it from its log: `callee_urls`); its restarts keep that port,
    and the consumers started after it call it there. Every callee gets the fleet's bearer
    token (`token`)."""

    def __init__(self, settings: Settings, log_dir: Path, duplicate_rate: float,
                 extra_env: dict[str, str] | None = None,
                 callees: Sequence[str] | None = None, zygote: Zygote | None = None) -> None:
        """`callees`: the endpoints served over HTTP (default: the registry's callees, of
        the service `settings` names). `zygote`: fork the processes from it (tools/zygote.py:
        the framework imported once, a start costs a fraction of a second of CPU instead of
        seconds); default: start each one cold."""
        self.zygote = zygote
        self.log_dir = log_dir
        if callees is None:
            callees = resolve_service(settings).registry.names(Role.CALLEE)
        self.callees = tuple(callees)
        self.callee_urls: dict[str, str] = {}
        self.callee_ports: dict[str, int] = dict.fromkeys(self.callees, 0)
        self.token = secrets.token_urlsafe(24)
        self.env = {**os.environ, "EO_PROFILE": "local",
                    "EO_DATABASE_DSN": settings.database(), "EO_AMQP_URL": settings.amqp(),
                    "EO_AMQP_ADDRESSES": json.dumps(list(settings.rabbitmq.amqp_addresses)),
                    "EO_BLOB_DIR": str(settings.blobs.blob_dir), "EO_METRICS_PORT": "0",
                    "EO_LOG_LEVEL": "INFO", "EO_SWEEP_INTERVAL_S": "1",
                    "EO_DUPLICATE_RATE": str(duplicate_rate), "EO_FAILPOINTS": "",
                    "EO_S3_ENDPOINT_URL": settings.blobs.s3_endpoint_url or "",
                    "EO_S3_BUCKET": settings.bucket(),
                    "EO_S3_ACCESS_KEY": _secret(settings.blobs.s3_access_key),
                    "EO_S3_SECRET_KEY": _secret(settings.blobs.s3_secret_key),
                    "EO_STRATEGIES": json.dumps({k: str(v)
                                                 for k, v in settings.strategies.items()}),
                    **{f"EO_CALLEES__{name.upper()}__TOKEN": self.token
                       for name in self.callees},
                    "EO_SERVICE": settings.service,
                    "EO_POOL_SIZE": "3"}
        for name, api in settings.http.apis.items():  # third-party APIs at a shared provider
            if api.url is not None:
                self.env[f"EO_APIS__{name.upper()}__URL"] = api.url
        self.env.pop("EO_TOKEN_DSN", None)  # the co-located path unless extra_env says
        self.env.update(extra_env or {})
        self.procs: dict[str, subprocess.Popen[bytes] | ZygoteProcess] = {}
        self.starts: Counter[str] = Counter()

    def start(self, name: str, endpoint: str, env: Mapping[str, str | None] | None = None
              ) -> None:
        """Start (or restart) process `name` consuming `endpoint` (serving it: a callee),
        with `env` over the fleet's environment (e.g. `EO_FAILPOINTS` for this process; a
        None value unsets the variable)."""
        self.starts[name] += 1
        path = self.log_dir / f"{name}.{self.starts[name]}.jsonl"
        if self.zygote is not None:
            self.procs[name] = self.zygote.spawn(self.args(endpoint), self.env_of(endpoint, env),
                                                 path, Path.cwd())
            return
        command = [sys.executable, "-c", "from entrypoints.cli import main; main()",
                   *self.args(endpoint)]
        with path.open("wb") as log:
            self.procs[name] = subprocess.Popen(command, env=self.env_of(endpoint, env),
                                                stdout=log, stderr=log)

    def args(self, endpoint: str) -> list[str]:
        """The `eo` arguments of a process of `endpoint`."""
        verb = "serve" if endpoint in self.callees else "consume"
        return [verb, "--endpoint", endpoint]

    def env_of(self, endpoint: str, env: Mapping[str, str | None] | None = None
               ) -> dict[str, str]:
        """The environment of a process of `endpoint`: the fleet's, a callee's own port (the
        one it first got, on a restart) or, for every other process, each callee's URL once
        known, then `env` (None: unset)."""
        own: dict[str, str] = {}
        for callee in self.callees:
            if endpoint == callee:
                own[f"EO_CALLEES__{callee.upper()}__PORT"] = str(self.callee_ports[callee])
            elif callee in self.callee_urls:
                own[f"EO_CALLEES__{callee.upper()}__URL"] = self.callee_urls[callee]
        merged = {**self.env, **own, **(env or {})}
        return {k: v for k, v in merged.items() if v is not None}

    def caller_settings(self, settings: S) -> S:
        """`settings` calling the fleet's callee processes over HTTP (the final sweep's)."""
        callees = dict(settings.http.callees)
        for name, url in self.callee_urls.items():
            callees[name] = CalleeSettings.model_validate({"url": url, "token": self.token})
        return settings.replaced(callees=callees)

    async def wait_for_callee(self, name: str, timeout_s: float = 60.0) -> None:
        """Until callee process `name` has logged its URL (`callee.serving`) and answers
        /health (then `callee_urls[name]`); RuntimeError if it died or never did."""
        deadline = time.monotonic() + timeout_s
        log = self.log_dir / f"{name}.{self.starts[name]}.jsonl"
        async with httpx.AsyncClient() as client:
            while time.monotonic() < deadline:
                if self.procs[name].poll() is not None:
                    raise RuntimeError(f"the {name} process exited: see its log in "
                                       f"{self.log_dir}")
                url = serving_url(log)
                try:
                    if url and (await client.get(f"{url}/health")).status_code == 200:
                        self.callee_urls[name] = url
                        self.callee_ports[name] = int(url.rsplit(":", 1)[1])
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError(f"{name} did not answer within {timeout_s} s")

    def stop(self, name: str, timeout_s: float = 30.0) -> int | None:
        """SIGTERM process `name` (a graceful stop: what it holds goes back to its queue),
        SIGKILL when it has not exited within `timeout_s`; returns its exit code."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            return None

    def kill(self, name: str) -> None:
        """SIGKILL: no clean-up, no ack; its deliveries go back to the queue."""
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    def stop_all(self, timeout_s: float = 30.0, keep: tuple[str, ...] = ()
                 ) -> dict[str, int | None]:
        """SIGTERM every process but `keep` (graceful), then SIGKILL stragglers; returns
        their exit codes."""
        procs = {n: p for n, p in self.procs.items() if n not in keep}
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        codes: dict[str, int | None] = {}
        for name, proc in procs.items():
            try:
                codes[name] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = None
        return codes

    def events(self) -> Counter[tuple[str, str]]:
        """Protocol events per (endpoint, event) over every log, killed processes' too."""
        counts: Counter[tuple[str, str]] = Counter()
        for path in self.log_dir.glob("*.jsonl"):
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    record = json.loads(line)
                    counts[(record.get("endpoint", ""), record.get("event", ""))] += 1
        return counts


async def final_sweep(settings: Settings, service: Service) -> None:
    """Every endpoint's sweeper once, as if every grace period had passed (quiescence), then
    every consuming endpoint's dead-letter queue moved into the dead-letter store (what its
    consumers do every sweep interval): the store then holds every dead letter, one entry
    per message, as an operator finds them."""
    configure_logging("WARNING")  # the report is the output; the processes' logs are on disk
    container = LocalContainer(settings=settings.replaced(duplicate_rate=0.0),
                               service=service)
    await container.init_resources()  # type: ignore[misc]
    try:
        system = await provided(container.workers)
        later = OffsetClock(system.clock, timedelta(seconds=settings.protocol.cleanup_grace_s
                                                    + settings.protocol.stale_after_s + 1))
        for name in service.registry.names():
            await system.sweeper(name, later).sweep()
        if settings.dead_letters.dead_letter_collect:
            rabbit = await provided(container.rabbit)
            kept = await provided(container.dead_letter_store)
            for name in service.registry.consuming():
                collector = dead_letter_collector(settings, rabbit, name, kept,
                                                  container.service_user(), system.events)
                assert collector is not None  # EO_DEAD_LETTER_COLLECT is on
                await collector.drain()
    finally:
        await container.shutdown_resources()  # type: ignore[misc]


async def business_states(service: Service, pool: asyncpg.Pool) -> dict[str, dict[str, Any]]:
    """Every endpoint's business state per partition (callees included): the transaction
    records' states, or the stream's newest snapshots for a `state` endpoint."""
    inspection = postgres_inspection(pool, pool, SystemClock(), service)
    return {name: await inspection.states(name) for name in service.registry.names()}


