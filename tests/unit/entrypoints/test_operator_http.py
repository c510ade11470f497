"""The operators' two HTTP servers in process (httpx's ASGI transport, the counters service's
memory adapters): the dead-letter API (entrypoints/dead_letter_api.py, `eo dead-letters
serve`) and the operator's page with the same API under `/api` (entrypoints/operator_page.py,
`eo operator`). Bad input gets a 422 naming the field and the limit, never the input echoed
back.
The same servers as processes: tests/integration/test_dead_letter_process.py,
tests/integration/test_operator_page.py (in a browser)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from adapters.memory.dead_letter_store import MemoryDeadLetterStore
from entrypoints.dead_letter_api import create_dead_letter_app
from entrypoints.operator_page import create_operator_app
from tests.support.counters.harness import counters

TOKEN = "alice-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _status() -> dict[str, Any]:
    return {"service": "counters", "endpoints": {}}


def _app(server: str) -> FastAPI:
    system = counters()
    operations = system.system.dead_letters(MemoryDeadLetterStore(system.clock))
    if server == "dead-letters":
        return create_dead_letter_app(operations, {"alice": TOKEN})
    return create_operator_app(operations, {"alice": TOKEN}, _status)


#: each server, and where its dead-letter API is
SERVERS = {"dead-letters": "", "operator": "/api"}


@pytest.fixture(params=list(SERVERS))
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """(a client of the server, the prefix of its dead-letter API)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app(request.param)),
                                 base_url="http://operator") as client:
        yield client, SERVERS[request.param]


async def test_a_validation_error_never_echoes_the_input_back(
        server: tuple[httpx.AsyncClient, str]) -> None:
    client, api = server
    why = "x" * 5_000_000
    for path in ("/dead-letters/1/discard", "/dead-letters/discard"):
        answer = await client.post(api + path, json={"why": why, "all": True}, headers=AUTH)
        assert answer.status_code == 422
        assert len(answer.content) < 2000, answer.content[:200]
        assert "why" in answer.json()["error"]
        assert "at most 1000 characters" in answer.json()["error"]
    # many invalid items: a bounded list of errors, the rest counted
    answer = await client.post(api + "/dead-letters/replay", headers=AUTH,
                               json={"ids": ["x"] * 100_000, "all": True})
    assert answer.status_code == 422
    assert len(answer.content) < 4000
    assert "and 99999 more" in answer.json()["error"]
