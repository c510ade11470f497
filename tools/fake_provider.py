"""A fake third-party API with Stripe-like idempotency keys, served over HTTP by uvicorn in a
process of its own: `python -m tools.fake_provider [--window-s S] [--latency-s S]`. `eo chaos`
calls it as the sample's carrier, the framework's process tests as theirs, and a developer
may point `EO_APIS__<NAME>__URL` at it for local runs with competing consumers (they share
its keys, which per-process sandboxes would not).

It answers every path (`adapters.memory.apis.IdempotentProvider`: a stored answer per
`Idempotency-Key` for the window, 409 while the key's first request runs, 422 for a key
reused with another request), on 127.0.0.1 and a free port, which it prints as one JSON line
(`{"event": "provider.serving", "url": ...}`). Its users steer and read it under `/_fake`:
`POST /_fake/faults` (`{"fail_next": n, "latency_s": s}`: the next n requests answer 503
before anything runs; each execution takes s seconds), `POST /_fake/reset` (forget every
key and count) and `GET /_fake/stats` (requests answered, executions per key).
`fake_provider()` starts one; `FakeProvider` talks to it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from adapters.memory.apis import IdempotentProvider

ROOT = Path(__file__).resolve().parents[1]


def create_app(provider: IdempotentProvider) -> FastAPI:
    """The provider's HTTP face (see the module docstring)."""
    app = FastAPI(title="fake third-party API")

    @app.post("/_fake/faults")
    async def faults(request: Request) -> dict[str, Any]:
        body = await request.json()
        provider.fail_next = int(body.get("fail_next", provider.fail_next))
        provider.latency_s = float(body.get("latency_s", provider.latency_s))
        return {"fail_next": provider.fail_next, "latency_s": provider.latency_s}

    @app.post("/_fake/reset")
    async def reset() -> dict[str, Any]:
        provider.keys.clear()
        provider.executions.clear()
        provider.requests, provider.fail_next, provider.latency_s = 0, 0, 0.0
        return {"reset": True}

    @app.get("/_fake/stats")
    async def stats() -> dict[str, Any]:
        return {"requests": provider.requests, "executions": dict(provider.executions)}

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def anything(path: str, request: Request) -> JSONResponse:
        body = await request.body()
        answer = await provider.handle(request.method, f"/{path}", body or None,
                                       request.headers.get("Idempotency-Key"))
        return JSONResponse(dict(answer.body), status_code=answer.status)

    return app


async def _serve(window_s: float, latency_s: float, host: str = "127.0.0.1") -> None:
    provider = IdempotentProvider(window_s=window_s, latency_s=latency_s)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    port = sock.getsockname()[1]
    print(json.dumps({"event": "provider.serving", "url": f"http://{host}:{port}"}),
          flush=True)
    config = uvicorn.Config(create_app(provider), log_level="warning", lifespan="off")
    await uvicorn.Server(config).serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window-s", type=float, default=24 * 3600.0)
    parser.add_argument("--latency-s", type=float, default=0.0)
    parser.add_argument("--host", default="127.0.0.1", help="the IPv4 address to listen on")
    args = parser.parse_args()
    asyncio.run(_serve(args.window_s, args.latency_s, args.host))


@dataclass
class FakeProvider:
    """A running fake provider process: its `url`, steering and statistics."""

    popen: subprocess.Popen[bytes]
    url: str

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None
              ) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    def faults(self, fail_next: int = 0, latency_s: float = 0.0) -> None:
        """Answer the next `fail_next` requests 503; each execution takes `latency_s`."""
        self._call("POST", "/_fake/faults", {"fail_next": fail_next, "latency_s": latency_s})

    def reset(self) -> None:
        """Forget every key, count and fault."""
        self._call("POST", "/_fake/reset", {})

    def stats(self) -> dict[str, Any]:
        """`requests` answered and `executions` per key so far."""
        return self._call("GET", "/_fake/stats")


@contextlib.contextmanager
def fake_provider(log: Path, window_s: float = 24 * 3600.0, host: str = "127.0.0.1"
                  ) -> Iterator[FakeProvider]:
    """A fake provider process listening on `host` (its output in `log`), killed on exit."""
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "tools.fake_provider", "--window-s", str(window_s),
             "--host", host],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=out, stdin=subprocess.DEVNULL)
    try:
        assert popen.stdout is not None
        deadline = time.monotonic() + 30
        line = b""
        while not line and time.monotonic() < deadline and popen.poll() is None:
            line = popen.stdout.readline()
        if not line:
            raise RuntimeError(f"the fake provider did not start: {log.read_text()[-2000:]}")
        yield FakeProvider(popen, json.loads(line)["url"])
    finally:
        popen.kill()
        popen.wait(timeout=10)


if __name__ == "__main__":
    main()
